"""The TRL peer (experiments/peer.py): its reward is the task's, its clock leaves evaluation out, and a short
run on the tiny model trains, evaluates at the start, on schedule and at the end, and records itself."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from experiments.peer import Clock, completion_text, main, make_reward, run
from tba.tasks import make_task


def test_the_reward_is_the_tasks_on_plain_and_conversational_completions() -> None:
    task = make_task("arithmetic")
    prompts = {p.prompt_id: p for p in task.eval_prompts(2)}
    (a, pa), (b, pb) = prompts.items()
    reward = make_reward(task, prompts)
    assert reward(completions=[pa.answer, "nonsense"], prompt_id=[a, b]) == [1.0, 0.0]
    chat = [[{"role": "assistant", "content": pb.answer}], [{"role": "assistant", "content": ""}]]
    assert reward(completions=chat, prompt_id=[b, a], completion_ids=[[1], [2]]) == [1.0, 0.0]
    assert completion_text([{"role": "assistant", "content": "4"}, {"role": "assistant", "content": "2"}]) == "42"


def test_the_clock_leaves_out_the_time_spent_evaluating() -> None:
    now = iter([10.0, 12.0, 15.0, 16.0, 20.0])
    clock = Clock(lambda: next(now))
    clock.start()  # 10
    assert clock.elapsed() == 2.0  # 12
    clock.pause_while(lambda: None)  # 15 .. 16: one second paused
    assert clock.elapsed() == 9.0  # 20 - 10 - 1


@pytest.mark.slow
def test_a_short_run_trains_evaluates_and_records_itself(tiny_model: Path, tmp_path: Path) -> None:
    out = tmp_path / "peer"
    small = dict(per_device_train_batch_size=8, num_generations=4, max_completion_length=8)
    summary = run(
        tiny_model, "arithmetic", {}, 0.05, 0, out, eval_prompts=4, eval_every=1.0, overrides=small, train_prompts=200
    )
    assert json.loads((out / "summary.json").read_text()) == summary
    evals = summary["evaluations"]
    assert evals[0] == {"t": 0.0, "step": 0, "accuracy": 0.0}  # the raw model, before any step
    assert len(evals) >= 3 and evals[-1]["t"] >= 3.0  # on schedule, and once more when the budget is spent
    assert [e["t"] for e in evals] == sorted(e["t"] for e in evals)
    assert summary["steps"] > 0 and summary["samples_trained"] == 8 * summary["steps"]
    assert summary["settings"]["beta"] == 0.05 and summary["settings"]["num_generations"] == 4
    steps = [json.loads(line) for line in (out / "steps.jsonl").read_text().splitlines()]
    assert len([s for s in steps if "reward" in s]) == summary["steps"]  # TRL's metrics of every step
    assert [json.loads(line) for line in (out / "evals.jsonl").read_text().splitlines()] == evals


def test_bad_arguments_are_explained(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    for argv, message in [
        (["--task-options", "{oops"], "--task-options: not JSON"),
        (["--task-options", '{"dataset": "chain_summ"}'], "no dataset 'chain_summ'"),
        (["--minutes", "0"], "need --minutes > 0"),
    ]:
        with pytest.raises(SystemExit) as exit_info:
            main([*argv, "--out", str(tmp_path)])
        assert exit_info.value.code == 2 and message in capsys.readouterr().err


@pytest.mark.parametrize(("dtype", "bf16_cpu", "bf16"), [("bfloat16", True, True), ("bfloat16", False, False)])
def test_the_peer_computes_in_the_precision_the_recipe_s_trainer_computes_in(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, dtype: str, bf16_cpu: bool, bf16: bool
) -> None:
    """bf16 autocast where the profile's trainer computes in bfloat16 on this CPU, float32 where the CPU would
    emulate it (tba.model.precision), so that the comparison with the recipe holds on either kind of CPU."""
    from experiments import peer
    from tba.model import precision

    seen: dict = {}
    monkeypatch.setattr(peer, "run", lambda *a, overrides=None, **kw: seen.update(overrides))
    monkeypatch.setattr(precision, "computes_bf16", lambda cpuinfo=None: bf16_cpu)
    monkeypatch.setenv("TBA_DTYPE", dtype)
    assert main(["--model", str(tmp_path), "--out", str(tmp_path / "out")]) == 0
    assert seen["bf16"] is bf16 and seen["max_completion_length"] == 32
