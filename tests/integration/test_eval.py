"""``tba eval``: the pass@k estimator, distinct-answer counting, and evaluation of the real SFT model
straight and through a published checkpoint (verified by its hash)."""

from __future__ import annotations

import itertools
import json
import shutil
from math import comb
from pathlib import Path

import pytest

from tba.checkpoints import CheckpointStore
from tba.cli import main as tba_main
from tba.model.evaluation import cut_at_stop, evaluate_checkpoint, pass_at_k, score_samples
from tba.model.sft import read_result
from tba.tasks import Prompt, make_task


def brute_force_pass_at_k(n: int, c: int, k: int) -> float:
    """Fraction of the k-subsets of n samples (c correct) holding at least one correct sample."""
    samples = [True] * c + [False] * (n - c)
    subsets = list(itertools.combinations(range(n), k))
    return sum(any(samples[i] for i in s) for s in subsets) / len(subsets)


def test_pass_at_k_is_the_unbiased_estimator() -> None:
    for n, c, k in [(4, 1, 1), (4, 1, 2), (6, 2, 3), (8, 0, 4), (8, 8, 1), (7, 3, 7), (5, 4, 2)]:
        assert pass_at_k(n, c, k) == pytest.approx(brute_force_pass_at_k(n, c, k))
    assert pass_at_k(16, 4, 1) == pytest.approx(4 / 16)
    assert pass_at_k(16, 1, 16) == 1.0 and pass_at_k(16, 0, 16) == 0.0
    assert pass_at_k(10, 3, 5) == pytest.approx(1 - comb(7, 5) / comb(10, 5))
    for bad in [(4, 5, 1), (4, 1, 5), (4, 1, 0)]:
        with pytest.raises(ValueError):
            pass_at_k(*bad)


def test_a_completion_ends_with_the_token_that_completes_a_stop_string() -> None:
    from tba.model.tokenizer import build_tokenizer

    tok = build_tokenizer()  # one token per character
    ids = tok.encode("7\n\nThe answer is 7", add_special_tokens=False)
    assert tok.decode(cut_at_stop(ids, tok, ["\n"])[0]) == "7\n"
    assert tok.decode(cut_at_stop(ids, tok, ["is", "\n\n"])[0]) == "7\n\n"  # the first stop string to appear
    assert cut_at_stop(ids, tok, ["?"]) == (ids, False)  # none appears: the whole completion
    assert cut_at_stop(ids, tok, []) == (ids, False)
    assert cut_at_stop([], tok, ["\n"]) == ([], False)


def test_distinct_correct_answers_are_counted_by_canonical_form() -> None:
    task = make_task("countdown")
    p1 = Prompt("24 from 2 3 4 6:", "24 from 2 3 4 6:", "24")
    p2 = Prompt("16 from 1 3 4 8:", "16 from 1 3 4 8:", "16")
    groups = [
        ["4*6", "6*4", "(4*6)", "2*3*4", "25", "x"],  # 4 correct, 2 distinct
        ["8*(3-1)", "4*4", "nope", "8+8", "(3-1)*8", "8*(4-3+1)"],
    ]  # 3 correct, 2 distinct
    out = score_samples(task, [p1, p2], groups, ks=[1, 2, 6])
    assert out["distinct_correct"] == pytest.approx(2.0)
    assert out["pass_at_k"]["1"] == pytest.approx((4 / 6 + 3 / 6) / 2)
    assert out["pass_at_k"]["2"] == pytest.approx((pass_at_k(6, 4, 2) + pass_at_k(6, 3, 2)) / 2)
    assert out["pass_at_k"]["6"] == 1.0
    assert out["sampled_reward"] == pytest.approx(7 / 12)
    arith = score_samples(make_task("arithmetic"), [Prompt("1+1=", "1+1=", "2")], [["2", "2", "3"]], ks=[1])
    assert arith["distinct_correct"] is None and arith["pass_at_k"]["1"] == pytest.approx(2 / 3)


@pytest.fixture(scope="module")
def sft_eval(sft_model: Path) -> dict:
    return evaluate_checkpoint(sft_model, "arithmetic", 200, samples=4, pass_k=(1, 2, 4), seed=0)


@pytest.mark.slow
def test_evaluates_the_sft_model(sft_eval: dict, sft_model: Path) -> None:
    r = sft_eval
    assert r["model"] == str(sft_model) and r["task"] == "arithmetic" and r["n_prompts"] == 200
    assert r["greedy_accuracy"] == pytest.approx(read_result(sft_model)["result"]["accuracy"], abs=0.02)
    assert r["greedy_reward"] == r["greedy_accuracy"]  # 0/1 rewards
    ks = [r["pass_at_k"][k] for k in ("1", "2", "4")]
    assert 0 < ks[0] <= ks[1] <= ks[2] <= 1  # more tries never hurt
    assert ks[2] > r["greedy_accuracy"]  # sampling at T=0.7 explores beyond the greedy answer
    assert r["sampled_reward"] == pytest.approx(ks[0])  # pass@1 from samples is the mean 0/1 reward
    assert r["distinct_correct"] is None
    assert r["examples"][0]["prompt"].endswith("=")


@pytest.mark.slow
def test_same_seed_same_result_and_countdown_has_diversity_figure(sft_eval: dict, sft_model: Path) -> None:
    again = evaluate_checkpoint(sft_model, "arithmetic", 200, samples=4, pass_k=(1, 2, 4), seed=0)
    assert {k: v for k, v in again.items() if k != "eval_seconds"} == {
        k: v for k, v in sft_eval.items() if k != "eval_seconds"
    }
    cd = evaluate_checkpoint(sft_model, make_task("countdown"), 20, samples=4, pass_k=(1, 4))
    assert cd["task"] == "countdown" and cd["n_prompts"] == 20
    assert cd["distinct_correct"] is not None and 0 <= cd["distinct_correct"] <= 4


@pytest.mark.slow
def test_cli_evaluates_a_published_checkpoint(sft_model: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    store = CheckpointStore(tmp_path / "ckpt")
    tmp = store.new_tmp_dir()
    for f in sft_model.iterdir():
        shutil.copy(f, tmp / f.name)
    manifest = store.commit(tmp, version=4, step=4)
    argv = [
        "eval",
        str(store.root),
        "--task",
        "arithmetic",
        "--n-prompts",
        "40",
        "--samples",
        "4",
        "--pass-k",
        "1,4",
        "--threads",
        "1",
        "--json",
    ]
    assert tba_main(argv) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["model"] == str(store.resolve(manifest)) and set(result["pass_at_k"]) == {"1", "4"}
    direct = evaluate_checkpoint(sft_model, "arithmetic", 40, samples=0)
    assert result["greedy_accuracy"] == pytest.approx(direct["greedy_accuracy"], abs=0.03)
    assert tba_main(argv[:-1]) == 0  # the table for people
    table = capsys.readouterr().out
    assert "pass@1 (greedy)" in table and "pass@4 (n=4, T=0.7)" in table and "%" in table
    weights = store.resolve(manifest) / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-8] + b"tampered")
    assert tba_main(argv) == 2
    assert "content hash" in capsys.readouterr().err


def test_the_checkpoints_of_a_run_are_evaluated_one_per_core_in_order(sft_model: Path, tiny_model: Path) -> None:
    """``tba up --eval-after`` evaluates what it set aside in processes of their own, one per core: the same
    accuracies as in this process, in the order asked, and no process left behind, even when the caller stops
    reading halfway."""
    import multiprocessing
    import os

    from tba.local.eval_pool import evaluate_on_cores, greedy_accuracy

    options = {"task": "arithmetic", "n_prompts": 40, "samples": 0}
    cpus = sorted(os.sched_getaffinity(0))
    models = [sft_model, tiny_model, sft_model]
    here = [greedy_accuracy(m, options, threads=1) for m in models]
    assert here[0] > here[1]  # two models told apart: the SFT base answers, the random one does not
    assert list(evaluate_on_cores(models, options, cpus)) == here
    assert multiprocessing.active_children() == []
    halfway = evaluate_on_cores(models, options, cpus)
    assert next(halfway) == here[0]
    halfway.close()  # the caller stopped (Ctrl-C): the workers are stopped too
    assert multiprocessing.active_children() == []
