"""The experiments' statistics and bookkeeping (pure functions; the runs themselves are `make experiment`), and
that a run ends with the experiment that started it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from experiments.arms import Arm, busy_fractions, ratio_spread, spread, time_to
from experiments.decoupling import EVAL_EVERY, coarse, training_time_to
from experiments.redteam import found
from tba.process_tree import alive
from tests.waiting import gone_within


def test_spread_says_how_many_seeds_it_covers_and_never_averages_the_missing() -> None:
    assert spread([10.0, 20.0, 30.0], "{:.0f}") == "20 ± 10 (10-30), n=3"
    assert spread([10.0, None, 30.0], "{:.0f}") == "20 ± 14 (10-30), reached by 2 of 3"
    assert spread([None, None]) == "not reached (0 of 2)"
    assert spread([0.5], unit="%") == "0.5%, n=1"


def test_ratios_pair_seeds_and_skip_pairs_that_did_not_both_reach() -> None:
    assert ratio_spread([100.0, 200.0, None], [200.0, 200.0, 50.0]) == "0.75 (per seed 0.50-1.00, 2 pairs)"
    assert ratio_spread([None], [1.0]) == "n/a (not reached by both)"


def test_time_to_target_is_the_first_evaluation_at_or_above_it() -> None:
    ev = [{"t": 0, "accuracy": 0.3}, {"t": 30, "accuracy": 0.5}, {"t": 60, "accuracy": 0.4}]
    assert time_to(ev, 0.5) == 30 and time_to(ev, 0.6) is None


def test_busy_fractions_per_cpu() -> None:
    assert busy_fractions([(0, 0), (10, 100)], [(50, 100), (10, 200)]) == [0.5, 0.0]


def test_arm_command_places_the_services_and_names_the_base() -> None:
    cmd = Arm("a", mode="sync", trainer_cpus="1", searcher_cpus="0", base_model="/m").command(
        3, 2.0, Path("/r"), 50, keep_evaluated=True
    )
    joined = " ".join(cmd)
    for part in (
        "--mode sync",
        "--seed 3",
        "--minutes 2.0",
        "--trainer-cpus 1",
        "--searcher-cpus 0",
        "--base-model /m",
        "--keep-evaluated",
        "--eval-prompts 50",
    ):
        assert part in joined
    assert "--backfill" not in joined  # unset: tba up's own default
    assert "--eval-after" not in joined
    assert "--eval-after" in Arm("c", eval_after=True).command(0, 5.0, Path("/r"), 200, False)
    backfilled = Arm("b", trainer_cpus="1", searcher_cpus="0", backfill=1).command(0, 5.0, Path("/r"), 200, False)
    assert backfilled[backfilled.index("--backfill") + 1] == "1"


def test_successes_are_counted_per_run_window_from_the_searchers_records(tmp_path: Path) -> None:
    rows = [(10.0, "177"), (11.0, "177"), (12.0, "77"), (99.0, "1770")]
    (tmp_path / "successes-searcher-0-1.jsonl").write_text(
        "".join(json.dumps({"t": t, "prompt": "p", "text": x}) + "\n" for t, x in rows)
    )
    (tmp_path / "successes-eval-2.jsonl").write_text(json.dumps({"t": 10.5, "prompt": "p", "text": "9977"}) + "\n")
    assert found(tmp_path, 0.0, 50.0) == {"successes": 3, "distinct": 2}  # evaluations' successes not counted


def test_the_trainer_s_compute_rate_is_read_by_the_batch_s_reward_without_its_warm_up() -> None:
    from experiments.real_model import WARM_STEPS, compute_rates

    def row(reward: float, tokens: int, seconds: float) -> dict:
        parts = {"ref_s": seconds / 4, "forward_s": seconds / 4, "backward_s": seconds / 2}
        return {"reward_mean": reward, "tokens": tokens, **parts}

    warm = [row(0.0, 100, 10.0)] * WARM_STEPS  # the trainer's first, slower steps: left out
    rows = [*warm, row(0.1, 600, 1.0), row(0.2, 900, 1.0), row(0.5, 800, 1.0), row(0.75, 1000, 1.0)]
    rows += [{"reward_mean": 1.0, "tokens": 5}, {"tokens": 5, "forward_s": 1.0}]  # no compute time, no reward: skipped
    assert compute_rates(rows) == {
        "below 0.25": {"steps": 2, "tokens_per_s": 750.0},
        "0.25 to 0.75": {"steps": 1, "tokens_per_s": 800.0},
        "0.75 and above": {"steps": 1, "tokens_per_s": 1000.0},
    }
    assert compute_rates(warm) == {}  # a run of its warm-up only


def test_decoupling_reads_staleness_update_to_data_and_the_cycle_from_a_run() -> None:
    from experiments.decoupling import cycle_parts, off_policy_distance, staleness_histogram, update_to_data

    rows = [
        {"ts": 0.0, "step_s": 0.1, "wait_s": 0.2, "staleness_hist": {"0": 6, "3": 2}},
        {"ts": 0.5, "step_s": 0.1, "wait_s": 0.3, "staleness_hist": {"9": 1, "100": 1}},
        {"ts": 1.1, "step_s": 0.2, "ref_s": 0.05, "wait_s": 0.3, "staleness_hist": {}},
    ]
    hist = staleness_histogram(rows)
    assert list(hist) == ["0", "1", "2", "3-4", "5-8", "9-16", "17-64", ">64"]
    assert hist["0"] == 0.6 and hist["3-4"] == 0.2 and hist["9-16"] == 0.1 and hist[">64"] == 0.1
    assert abs(sum(hist.values()) - 1) < 1e-9
    assert update_to_data({"buffer": {"samples_ingested": 200, "samples_served": 300}}) == 1.5
    assert update_to_data({"buffer": {}}) is None
    assert cycle_parts(rows) == {"cycle": 0.55, "compute": 0.1, "reference": 0.0, "wait": 0.3}
    assert cycle_parts(rows[2:] * 3)["reference"] == 0.05  # the trainer's reference pass (TBA_REF_PASS=trainer)
    assert off_policy_distance(rows) is None  # runs from before the trainer reported it
    distances = [{"samples": 64, "behaviour_log_ratio_abs": 0.5}, {"samples": 192, "behaviour_log_ratio_abs": 0.1}]
    assert off_policy_distance(rows + distances) == (64 * 0.5 + 192 * 0.1) / 256  # weighted by the samples


def test_decoupling_arms_differ_only_in_the_mode_and_run_the_configuration_s_task() -> None:
    from experiments.decoupling import TARGETS, arms

    for task in ("arithmetic", "calculator"):
        a, s, u = arms(task, ablation=True)
        assert (a.name, s.name, u.name) == ("async-tb", "sync-tb", "async-tb-uniform")
        assert {a.task, s.task, u.task} == {task} and task in TARGETS
        assert (a.mode, s.mode, u.mode) == ("async", "sync", "async")
        assert s.env["TBA_MAX_BATCHES_PER_VERSION"] == "1" and u.env == {"TBA_RECENCY_ORDER": "newest"}
        assert {x.searcher_cpus for x in (a, s, u)} == {"0"} and {x.trainer_cpus for x in (a, s, u)} == {"1"}
    assert len(arms("arithmetic", ablation=False)) == 2


def test_more_search_adds_a_second_searcher_on_the_trainer_s_core_to_both_arms() -> None:
    from experiments.decoupling import arms, pairs

    a, s, ab, s2 = arms("calculator", more_search=True)
    assert (ab.name, ab.mode, ab.backfill, ab.env) == ("async-tb-backfill", "async", 1, {})
    assert (s2.name, s2.mode, s2.backfill) == ("sync-tb-2-searchers", "sync", 1)
    # The two synchronous searchers generate a step's prompts between them, one batch per version each.
    assert int(s2.env["TBA_PROMPTS_PER_BATCH"]) * 2 == int(s.env["TBA_PROMPTS_PER_BATCH"])
    assert s2.env["TBA_MAX_BATCHES_PER_VERSION"] == "1"
    assert {x.trainer_cpus for x in (a, s, ab, s2)} == {"1"} and {x.searcher_cpus for x in (a, s, ab, s2)} == {"0"}
    assert pairs({x.name: x.mode for x in (a, s, ab, s2)}) == [
        ("async-tb", "sync-tb"),
        ("async-tb", "sync-tb-2-searchers"),
        ("async-tb-backfill", "sync-tb"),
        ("async-tb-backfill", "sync-tb-2-searchers"),
    ]


def test_samples_to_a_target_are_those_of_the_first_checkpoint_at_or_above_it() -> None:
    from experiments.decoupling import samples_to

    rows = [{"step": step, "samples": 64} for step in range(1, 11)] + [{"step": 11, "samples": 32}]  # a short batch
    evaluations = [{"version": 0, "accuracy": 0.35}, {"version": 4, "accuracy": 0.55}, {"version": 11, "accuracy": 0.7}]
    summary = {"evaluations": evaluations}
    assert samples_to(summary, rows, 0.3) == 0  # the base model is there already
    assert samples_to(summary, rows, 0.5) == 4 * 64
    assert samples_to(summary, rows, 0.6) == 10 * 64 + 32
    assert samples_to(summary, rows, 0.8) is None


def test_times_to_a_target_on_the_runs_grid_and_a_coarser_one() -> None:
    """The checkpoints are taken every EVAL_EVERY seconds (with a little drift); the coarser grid keeps one in 3."""
    accuracies = [0.30, 0.45, 0.52, 0.61, 0.58, 0.66, 0.72]
    evaluations = [{"t": i * EVAL_EVERY + 0.01 * i, "accuracy": a} for i, a in enumerate(accuracies)]
    assert [e["accuracy"] for e in coarse(evaluations)] == [0.30, 0.61, 0.72]
    summary = {"evaluations": evaluations, "started_at": 100.0}
    rows = [{"ts": 100.0 + EVAL_EVERY}]  # the trainer's first step, one grid step after the launch
    assert training_time_to(summary, rows, 0.5) == pytest.approx(EVAL_EVERY + 0.02)
    assert training_time_to(summary, rows, 0.5, every=3) == pytest.approx(2 * EVAL_EVERY + 0.03)
    assert training_time_to(summary, rows, 0.7, every=3) == pytest.approx(5 * EVAL_EVERY + 0.06)
    assert training_time_to(summary, rows, 0.8) is None


def test_an_lr_arm_is_its_mode_s_arm_at_another_peak_rate_and_a_bad_one_is_named() -> None:
    import argparse

    from experiments.decoupling import arms, lr_arm, pairs

    a, s, fast, slow = arms("arithmetic", extra=[lr_arm("async=4.5e-5"), lr_arm("sync=3e-5")])
    assert (fast.name, fast.mode, fast.env) == ("async-tb-lr4.5e-05", "async", {"TBA_LR": "4.5e-05"})
    assert (slow.name, slow.mode) == ("sync-tb-lr3e-05", "sync")
    assert slow.env == {**s.env, "TBA_LR": "3e-05"}  # exactly on-policy, as the synchronous arm
    assert {x.searcher_cpus for x in (a, s, fast, slow)} == {"0"}
    assert ("async-tb-lr4.5e-05", "sync-tb") in pairs({x.name: x.mode for x in (a, s, fast, slow)})
    for bad in ("async", "async=", "async=fast", "async=0", "async=-1e-5", "async=nan", "async=2", "grpo=1e-5"):
        with pytest.raises(argparse.ArgumentTypeError, match="expected async=LR or sync=LR"):
            lr_arm(bad)


def test_an_env_arm_is_its_mode_s_arm_with_those_settings_and_the_options_name_them_back() -> None:
    import argparse

    from experiments.decoupling import arm_flag, arms, env_arm, lr_arm, main

    _, s, floor, both = arms(
        "arithmetic",
        extra=[env_arm("async:TBA_LR_MIN_RATIO=0.45"), env_arm("sync:TBA_LR=3e-5,TBA_MAX_STALENESS=off")],
    )
    assert (floor.name, floor.mode, floor.env) == ("async-tb-lr-min-ratio0.45", "async", {"TBA_LR_MIN_RATIO": "0.45"})
    assert both.name == "sync-tb-lr3e-5-max-stalenessoff"
    assert both.env == {**s.env, "TBA_LR": "3e-5", "TBA_MAX_STALENESS": "off"}
    assert arm_flag(*lr_arm("async=2e-5")) == " --lr-arm async=2e-05"
    assert arm_flag(*env_arm("async:TBA_LR_MIN_RATIO=0.45")) == " --env-arm async:TBA_LR_MIN_RATIO=0.45"
    for bad in ("async", "async:", "async:LR=1", "async:TBA_LR", "async:TBA_LR=", "grpo:TBA_LR=1e-5", "async:tba_lr=1"):
        with pytest.raises(argparse.ArgumentTypeError, match="expected MODE:TBA_NAME=VALUE"):
            env_arm(bad)
    with pytest.raises(SystemExit):  # argparse names the bad value and exits 2 before any run starts
        main(["--env-arm", "async:LR=1"])


def test_a_run_ends_with_the_experiment_that_started_it_even_when_that_one_is_killed(tmp_path: Path) -> None:
    # The experiment: a process that runs a long child through run_child, then is killed with SIGKILL.
    pid_file = tmp_path / "child.pid"
    child_code = "import os, sys, time; open(sys.argv[1], 'w').write(str(os.getpid())); time.sleep(60)"
    script = (
        "import sys\n"
        "from experiments.arms import run_child\n"
        "with open(sys.argv[1], 'w') as log:\n"
        "    run_child([sys.executable, '-c', sys.argv[2], sys.argv[3]], log, {})\n"
    )
    experiment = subprocess.Popen(
        [sys.executable, "-c", script, str(tmp_path / "child.log"), child_code, str(pid_file)],
        cwd=Path(__file__).resolve().parents[2],
    )
    try:
        deadline = time.monotonic() + 30
        while not (pid_file.exists() and pid_file.read_text()) and time.monotonic() < deadline:
            time.sleep(0.05)
        child = int(pid_file.read_text())
        experiment.kill()
        experiment.wait(10)
        assert gone_within(child, 10), "the run outlived the experiment that started it"
    finally:
        experiment.kill()
        if pid_file.exists() and pid_file.read_text() and alive(child := int(pid_file.read_text())):
            os.kill(child, signal.SIGKILL)
