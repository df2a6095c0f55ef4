"""One step's figures reach /status, Prometheus, the JSON-lines file and the progress line alike."""

from __future__ import annotations

import json
import logging

from prometheus_client import generate_latest

from services.trainer.learner import StepResult
from services.trainer.metrics import TrainerMetrics


def result() -> StepResult:
    return StepResult(
        metrics={"loss": 0.5, "reward_mean": 0.25, "log_Z_mean": 3.5, "kl": 0.125, "prompts": 2.0},
        samples=8,
        prompts=2,
        tokens=160,
        micro_batches=2,
        seconds=0.5,
        grad_norm=1.5,
        lr=1e-4,
        staleness={0: 5, 2: 3},
    )


def test_record_feeds_status_prometheus_file_and_log(tmp_path, caplog) -> None:
    caplog.set_level(logging.INFO)
    path = tmp_path / "run" / "metrics.jsonl"
    m = TrainerMetrics(metrics_file=path, max_steps=10)
    m.set_state("training")
    m.set_version(2)
    m.record(3, 0.05, result(), wait_s=0.25, by_searcher={"searcher-0": 6, "searcher-1": 2})
    m.record(4, 0.05, result(), wait_s=0.0, by_searcher={"searcher-0": 8})

    status = m.status()
    assert status["state"] == "training" and status["step"] == 4 and status["version"] == 2
    assert status["tokens_per_s"] == 320 and status["samples_per_s"] == 16
    assert status["staleness"] == {"0": 5, "2": 3} and status["staleness_mean"] == 0.75
    assert status["log_Z_mean"] == 3.5 and status["kl"] == 0.125
    assert status["samples_trained_by_searcher"] == {"searcher-0": 14, "searcher-1": 2}  # summed over the steps

    lines = [json.loads(x) for x in path.read_text().splitlines()]
    assert [x["step"] for x in lines] == [3, 4] and lines[0]["wait_s"] == 0.25
    assert lines[0]["staleness_mean"] == 6 / 8 and lines[0]["beta"] == 0.05
    assert lines[0]["staleness_hist"] == {"0": 5, "2": 3} and lines[0]["ts"] > 1.7e9
    assert lines[0]["samples_by_searcher"] == {"searcher-0": 6, "searcher-1": 2}

    text = generate_latest(m.registry).decode()
    assert "tba_trainer_step 4.0" in text and "tba_trainer_samples_total 16.0" in text
    assert 'tba_trainer_state{state="training"} 1.0' in text
    assert "tba_trainer_sample_staleness_count 16.0" in text

    assert "step 4/10 | loss 0.5 | R 0.250" in caplog.text
    record = [r for r in caplog.records if r.name == "services.trainer.progress"][-1]
    assert record.fields["event"] == "step" and record.fields["loss"] == 0.5


def test_the_importance_figures_reach_the_row_and_prometheus_when_the_loss_gives_them(tmp_path) -> None:
    m = TrainerMetrics(metrics_file=tmp_path / "metrics.jsonl")
    plain = m.record(1, 0.05, result(), wait_s=0.0)
    assert "importance_weight_mean" not in plain
    weighted = result()
    weighted.metrics.update(behaviour_log_ratio_abs=0.25, importance_weight_mean=0.875, importance_clipped=0.125)
    row = m.record(2, 0.05, weighted, wait_s=0.0)
    assert (row["behaviour_log_ratio_abs"], row["importance_weight_mean"], row["importance_clipped"]) == (
        0.25,
        0.875,
        0.125,
    )
    text = generate_latest(m.registry).decode()
    assert "tba_trainer_importance_weight_mean 0.875" in text and "tba_trainer_importance_clipped 0.125" in text
    assert "tba_trainer_behaviour_log_ratio_abs 0.25" in text


def test_two_instances_do_not_collide_in_one_process() -> None:
    a, b = TrainerMetrics(), TrainerMetrics()
    a.set_version(1)
    b.set_version(7)
    assert a.status()["version"] == 1 and b.status()["version"] == 7


def test_status_splits_the_trainers_time_by_part(monkeypatch) -> None:
    """/status's ``time``: each part's seconds from the request for the first batch to the end of the last step or
    publish (a step under way is not counted), the rest as "other", and the busy fraction (everything but fetching
    and bookkeeping)."""
    now = [100.0]
    monkeypatch.setattr("services.trainer.metrics.time.monotonic", lambda: now[0])
    m = TrainerMetrics()
    assert m.status()["time"] == {}  # before the first step
    parts = dict(ref_seconds=0.5, forward_seconds=1.0, backward_seconds=1.5, optimizer_seconds=0.25)
    step = StepResult(**{**result().__dict__, "seconds": 3.5, **parts})
    m.record(1, 0.05, step, wait_s=1.0)  # at 100: the first batch was asked for at 100 - 3.5 - 1.0
    now[0] = 102.0
    m.published(2.0)
    now[0] = 106.0  # 0.5 s of bookkeeping, then a step of 3.5 s
    m.record(2, 0.05, step, wait_s=0.0)
    now[0] = 110.0  # a step under way: not counted
    split = m.status()["time"]
    assert split["wall_s"] == 10.5  # 95.5 .. 106
    assert split["seconds"] == {
        "fetch": 1.0,
        "reference": 1.0,
        "forward": 2.0,
        "backward": 3.0,
        "optimizer": 0.5,
        "publish": 2.0,
        "other": 1.0,
    }
    assert split["busy_fraction"] == round(8.5 / 10.5, 4)
