"""Experiment tracking (tba/tracking.py), read back with TensorBoard's own loader and from W&B's offline log."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tba.local.commands import tba_command
from tba.tracking import Tracker


def test_tensorboard_and_wandb_offline_hold_what_was_logged(tmp_path: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from tests.wandb_log import read_run

    tracker = Tracker(
        tmp_path / "tb",
        name="trainer",
        wandb_mode="offline",
        wandb_group="run-1",
        wandb_dir=tmp_path,
        config={"lr": 3e-5},
    )
    for step in (1, 2, 3):
        tracker.scalars(step, {"loss": 1.0 / step, "kl": None, "note": "text"}, prefix="trainer")
        tracker.histogram(step, "trainer/staleness", {0: 6, 3: 2})
    tracker.close()

    events = EventAccumulator(str(tmp_path / "tb"), size_guidance={"scalars": 0, "histograms": 0})
    events.Reload()
    assert events.Tags()["scalars"] == ["trainer/loss"]  # None and text are not numbers: not logged
    assert [(e.step, e.value) for e in events.Scalars("trainer/loss")] == [
        (1, 1.0),
        (2, pytest.approx(0.5)),
        (3, pytest.approx(1 / 3)),
    ]
    histogram = events.Histograms("trainer/staleness")[-1].histogram_value
    assert (histogram.num, histogram.min, histogram.max, histogram.sum) == (8, 0.0, 3.0, 6.0)

    (log,) = (tmp_path / "wandb").glob("offline-run-*/run-*.wandb")
    run = read_run(log)
    assert run["complete"], "W&B never finished its log"
    assert (run["group"], run["job_type"], run["name"]) == ("run-1", "trainer", "run-1-trainer")
    assert [(row["_step"], row["trainer/loss"]) for row in run["history"]] == [
        (1, 1.0),
        (2, 0.5),
        (3, pytest.approx(1 / 3)),
    ]


def test_wandb_asked_for_but_not_installed_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "wandb", None)  # what `import wandb` meets where it is not installed
    with pytest.raises(RuntimeError, match=r"pip install 'tba\[wandb\]'"):
        Tracker(None, name="trainer", wandb_mode="offline")
    assert not Tracker(None, name="trainer").enabled  # off by default: W&B is never imported


def test_tba_up_refuses_a_bad_wandb_mode_by_name() -> None:
    env = {**os.environ, "TBA_WANDB": "sometimes"}
    up = subprocess.run(tba_command("up"), capture_output=True, text=True, timeout=60, env=env)
    assert up.returncode == 2 and "TBA_WANDB must be off, offline or online, got 'sometimes'" in up.stderr
