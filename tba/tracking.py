"""Experiment tracking in the formats the field's tools read: TensorBoard event files and Weights & Biases.

The trainer logs each step's scalars and its staleness histogram here, ``tba up`` logs the held-out
evaluations; both write into the same TensorBoard directory (``<run dir>/tensorboard``), so
``tensorboard --logdir runs/`` shows every run with its ``trainer/*`` and ``eval/*`` series.

Weights & Biases is optional (``pip install 'tba[wandb]'``) and off by default. ``offline`` needs no
account: the run is written under ``<dir>/wandb/`` and can be uploaded later with ``wandb sync``.
The trainer and the evaluations are two W&B runs of one group (one process owns each run).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

log = logging.getLogger(__name__)

WandbMode = Literal["off", "offline", "online"]


class Tracker:
    """Scalars (and histograms) of one process, written to every sink that is configured."""

    def __init__(
        self,
        tensorboard_dir: Path | None,
        *,
        name: str,
        wandb_mode: WandbMode = "off",
        wandb_project: str = "tba",
        wandb_group: str | None = None,
        wandb_dir: Path | None = None,
        config: Mapping[str, Any] | None = None,
    ) -> None:
        self.tb = None
        self.wandb_run = None
        if tensorboard_dir is not None:
            try:
                from tensorboard.summary.writer.event_file_writer import EventFileWriter
            except ImportError as err:
                raise RuntimeError(
                    f"TensorBoard event files in {tensorboard_dir} need tensorboard: pip install tensorboard"
                ) from err
            tensorboard_dir.mkdir(parents=True, exist_ok=True)
            # One directory per run, one event file per process: TensorBoard merges the files of a directory.
            self.tb = EventFileWriter(
                str(tensorboard_dir), max_queue_size=100, flush_secs=10, filename_suffix=f".{name}"
            )
        if wandb_mode != "off":
            self.wandb_run = _start_wandb(wandb_mode, wandb_project, wandb_group, name, wandb_dir, config)

    @property
    def enabled(self) -> bool:
        return self.tb is not None or self.wandb_run is not None

    def scalars(self, step: int, values: Mapping[str, object], prefix: str) -> None:
        """``prefix/name`` = value at ``step`` for every value that is a number (None: not measured)."""
        clean = {f"{prefix}/{k}": float(v) for k, v in values.items() if isinstance(v, int | float)}
        if self.tb is not None:
            from tensorboard.compat.proto.summary_pb2 import Summary

            # One event holding every value of the step: a tenth of the cost of an event per value.
            self._write(step, Summary(value=[Summary.Value(tag=t, simple_value=v) for t, v in clean.items()]))
        if self.wandb_run is not None:
            self.wandb_run.log(clean, step=step)

    def histogram(self, step: int, tag: str, counts: Mapping[int, int]) -> None:
        """A histogram of integers (staleness in versions), given as value -> count: one bucket per value."""
        total = sum(counts.values())
        if self.tb is None or total == 0:
            return
        from tensorboard.compat.proto.summary_pb2 import HistogramProto, Summary

        values = sorted(counts)
        histogram = HistogramProto(
            min=values[0],
            max=values[-1],
            num=total,
            sum=sum(v * counts[v] for v in values),
            sum_squares=sum(v * v * counts[v] for v in values),
            bucket_limit=values,
            bucket=[counts[v] for v in values],
        )
        self._write(step, Summary(value=[Summary.Value(tag=tag, histo=histogram)]))

    def _write(self, step: int, summary) -> None:
        from tensorboard.compat.proto.event_pb2 import Event

        if self.tb is not None:
            self.tb.add_event(Event(wall_time=time.time(), step=step, summary=summary))

    def close(self) -> None:
        if self.tb is not None:
            self.tb.close()
            self.tb = None
        if self.wandb_run is not None:
            self.wandb_run.finish()
            self.wandb_run = None


def _start_wandb(
    mode: Literal["offline", "online"],
    project: str,
    group: str | None,
    name: str,
    directory: Path | None,
    config: Mapping[str, Any] | None,
):
    try:
        import wandb
    except ImportError as err:
        raise RuntimeError(f"TBA_WANDB={mode} needs Weights & Biases: pip install 'tba[wandb]'") from err
    if directory is not None:
        directory.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("WANDB_SILENT", "true")  # its banners would interleave with the services' logs
    run = wandb.init(
        project=project,
        group=group,
        name=f"{group}-{name}" if group else name,
        job_type=name,
        mode=mode,
        dir=str(directory) if directory else None,
        config=dict(config or {}),
        settings=wandb.Settings(console="off", x_disable_stats=True),
    )
    log.info("Weights & Biases run %s (%s) in %s", run.id, mode, run.dir)
    return run
