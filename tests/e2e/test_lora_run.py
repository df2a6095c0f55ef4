"""`TBA_LORA_RANK=8 tba up`: a LoRA run through the whole system.

One searcher (real vLLM with adapters enabled), the buffer, Redis and the trainer on the SFT base, for
a few steps: the trainer publishes adapters, the searcher adds each to its engine and stamps its groups
with the adapter's version, the run's evaluations read the adapters, nothing is left running. The run
evaluates after it stops (``--eval-after``): the adapters it set aside are evaluated once training is over,
each recorded at the time it was taken. The reference pass runs on the trainer (``TBA_REF_PASS=trainer``: the
policy with its adapters switched off), for every sample (the searcher does not reuse its own log-probs at the
base weights), so that the trainer's pass is taken in every step of a real run.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tba.local.commands import tba_command
from tests.e2e.test_local_run import test_nothing_left_running as _nothing_left_running

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.vllm]

STEPS = 4


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory, sft_model: Path) -> dict:
    run_dir = tmp_path_factory.mktemp("lora") / "run"
    env = {
        **os.environ,
        "TBA_LORA_RANK": "8",
        "TBA_LR": "1e-3",
        "TBA_CHECKPOINT_EVERY": "2",
        "TBA_WARMUP_SAMPLES": "32",
        "TBA_CHECKPOINT_GRACE_SECONDS": "5",
        "TBA_REF_PASS": "trainer",
        "TBA_REF_REUSE_AT_BASE": "false",
    }
    cmd = tba_command(
        "up",
        no_console=True,
        searchers=1,
        placement="shared",  # every process anywhere (tests/e2e/test_no_orphans.py runs the default)
        minutes=8,
        max_steps=STEPS,
        run_dir=run_dir,
        base_model=sft_model,
        eval_every=1,
        eval_after=True,
        eval_prompts=50,
        no_report=True,
    )
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=8 * 60 + 240)
    assert proc.returncode == 0, f"tba up failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return {"dir": run_dir, "summary": json.loads((run_dir / "summary.json").read_text())}


def test_the_trainer_published_adapters_and_the_searcher_served_them(run: dict) -> None:
    from tba.checkpoints import CheckpointStore
    from tba.model.adapters import is_adapter

    store = CheckpointStore(run["dir"] / "checkpoints")
    assert store.versions() and all(is_adapter(store.step_dir(v)) for v in store.versions())
    assert max(run["summary"]["versions_published"]) == STEPS
    log = (run["dir"] / "logs" / "searcher-0.log").read_text()
    served = run["summary"]["searcher_versions"]["searcher-0"]
    assert max(served) > 0 and "reloaded v" in log, "the searcher never switched to an adapter"


def test_the_trainer_computed_every_reference_log_prob(run: dict) -> None:
    from tba.local.report import read_jsonl

    steps = read_jsonl(run["dir"] / "trainer_metrics.jsonl")
    assert len(steps) == STEPS and all(0 < r["ref_s"] < r["step_s"] for r in steps), steps
    assert "no reference log-prob" not in (run["dir"] / "logs" / "trainer.log").read_text()


def test_the_runs_evaluations_read_the_adapters(run: dict) -> None:
    evals = [json.loads(line) for line in (run["dir"] / "evals.jsonl").read_text().splitlines()]
    assert any(e["version"] > 0 for e in evals), evals
    assert run["summary"]["accuracy_end"] is not None


def test_the_adapters_set_aside_were_evaluated_after_training_at_the_time_taken(run: dict) -> None:
    from tba.local.report import read_jsonl

    summary = run["summary"]
    evals = summary["evaluations"]
    last_step = read_jsonl(run["dir"] / "trainer_metrics.jsonl")[-1]["ts"] - summary["started_at"]
    assert evals[0]["version"] == 0 and evals[-1]["version"] == max(summary["versions_published"])
    assert [e["version"] for e in evals] == sorted({e["version"] for e in evals}), "each version once, in order"
    assert all(a["t"] < b["t"] for a, b in zip(evals, evals[1:], strict=False)), evals
    assert all(e["t"] <= e["evaluated_at"] for e in evals), evals
    assert min(e["evaluated_at"] for e in evals) >= last_step, "an evaluation ran while the trainer trained"
    assert not (run["dir"] / "evaluated").exists(), "the links are dropped after the run (no --keep-evaluated)"


def test_nothing_left_running(run: dict) -> None:
    _nothing_left_running(run)
