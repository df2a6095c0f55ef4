"""What the trainer reports after each step: Prometheus series, ``/status``, a JSON line, a console line,
TensorBoard and W&B.

One :meth:`TrainerMetrics.record` call feeds them all from the same numbers, so
the dashboard (``tba up`` polls ``/status``), the Prometheus scrape, the
structured log, the end-to-end report's metrics file and the tracking tools never disagree.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from services.trainer.bounds import ALL_WAIT_REASONS
from services.trainer.learner import StepResult
from tba.tracking import Tracker

log = logging.getLogger("services.trainer.progress")

STATES = ("starting", "warmup", "training", "waiting", "done")
# The parts of the trainer's time in /status's ``time``: getting each batch from the buffer (waits included),
# the reference pass, the policy's forward and backward, the optimizer, publishing checkpoints; "other" is
# the rest of the wall time (batch checks, metrics, logging).
TIME_PARTS = ("fetch", "reference", "forward", "backward", "optimizer", "publish")
BUSY_PARTS = ("reference", "forward", "backward", "optimizer", "publish")
# Figures only some losses or settings report: in a step's row (and as gauges) when its loss gave them.
LOSS_METRICS = ("advantage_abs_mean", "behaviour_log_ratio_abs", "importance_weight_mean", "importance_clipped")


class TrainerMetrics:
    def __init__(
        self, registry: CollectorRegistry | None = None, metrics_file: Path | None = None, max_steps: int | None = None
    ) -> None:
        self.registry = registry or CollectorRegistry()
        self.metrics_file = metrics_file
        self.max_steps = max_steps
        self.tracker: Tracker | None = None  # TensorBoard / W&B, set by the trainer's main rank
        self._lock = threading.Lock()
        self._publishes, self._publish_seconds = 0, 0.0  # checkpoints published by this process, their time
        # Where this process's time goes from the request for its first batch on (seconds, by part: TIME_PARTS).
        self._time: dict[str, float] = dict.fromkeys(TIME_PARTS, 0.0)
        self._time_origin: float | None = None
        self._time_until = 0.0  # the end of the last step or publish counted: a step under way is not
        self._status: dict[str, Any] = {
            "state": "starting",
            "step": 0,
            "version": None,
            "loss": None,
            "reward_mean": None,
            "log_Z_mean": None,
            "kl": None,
            "beta": None,
            "lr": None,
            "samples_per_s": None,
            "tokens_per_s": None,
            "wait_s": 0.0,
            "waiting_for": None,
            "reuse": None,
            "publish_s_mean": None,
            "staleness": {},
            "staleness_mean": None,
            "buffer_failures": 0,
            "samples_trained_by_searcher": {},  # this process's steps, by the searcher that generated the samples
        }
        r = self.registry
        self.g = {
            name: Gauge(f"tba_trainer_{name}", doc, registry=r)
            for name, doc in [
                ("step", "Optimizer steps taken."),
                ("version", "Latest published policy version."),
                ("loss", "Loss of the last step."),
                ("reward_mean", "Mean reward of the last batch."),
                ("log_Z_mean", "Mean per-prompt log Z of the last batch."),
                ("kl", "Mean log pi - log pi_ref of the last batch (KL estimate)."),
                ("beta", "KL coefficient of the last step."),
                ("lr", "Learning rate of the last step."),
                ("grad_norm", "Gradient norm before clipping."),
                ("samples_per_s", "Samples per second of compute."),
                ("tokens_per_s", "Tokens per second of compute."),
                ("staleness_mean", "Mean staleness of the batch."),
                ("mixed_fraction", "Share of the batch's prompts whose samples differ in reward (carry a signal)."),
                (
                    "behaviour_log_ratio_abs",
                    "Mean |log pi - log mu| of the last batch: how far the policy is from the ones that drew it.",
                ),
                ("importance_weight_mean", "Mean importance weight of the last batch (TBA_IMPORTANCE_CLIP)."),
                ("importance_clipped", "Share of the last batch whose importance weight the clip bound."),
            ]
        }
        self.state_gauge = Gauge("tba_trainer_state", "1 for the current state.", ["state"], registry=r)
        self.samples_total = Counter("tba_trainer_samples", "Samples trained on.", registry=r)
        self.tokens_total = Counter("tba_trainer_tokens", "Tokens trained on.", registry=r)
        self.wait_total = Counter(
            "tba_trainer_wait_seconds",
            "Time spent waiting for batches, by why: fresh_samples (the staleness bound, or too few prompts), "
            "reuse (the reuse bound), on_policy (sync mode: the version's samples).",
            ["reason"],
            registry=r,
        )
        for reason in ALL_WAIT_REASONS:  # every series exists from the start, at 0 until that wait happens
            self.wait_total.labels(reason)
        self.g["reuse"] = Gauge(
            "tba_trainer_reuse", "Samples trained on per sample generated over the run.", registry=r
        )
        self.buffer_failures = Counter("tba_trainer_buffer_failures", "Transient buffer failures.", registry=r)
        self.dropped_groups = Counter("tba_trainer_dropped_groups", "Groups dropped as invalid.", registry=r)
        self.step_seconds = Histogram("tba_trainer_step_seconds", "Compute time per optimizer step.", registry=r)
        self.checkpoint_seconds = Histogram(
            "tba_trainer_checkpoint_seconds", "Time to publish a checkpoint.", registry=r
        )
        self.staleness = Histogram(
            "tba_trainer_sample_staleness",
            "Versions between a sample and the policy.",
            buckets=(0, 1, 2, 4, 8, 16, 32, 64),
            registry=r,
        )
        self.set_state("starting")

    def set_state(self, state: str) -> None:
        for s in STATES:
            self.state_gauge.labels(s).set(1 if s == state else 0)
        with self._lock:
            self._status["state"] = state

    def set_version(self, version: int) -> None:
        self.g["version"].set(version)
        with self._lock:
            self._status["version"] = version

    def add_wait(self, seconds: float, reason: str | None) -> None:
        """``seconds`` spent on a batch's request, waiting because of ``reason`` (None: it did not wait, and
        the request's own time is not counted)."""
        if reason is not None:
            self.wait_total.labels(reason).inc(seconds)

    def set_waiting(self, reason: str) -> None:
        """The trainer waits for a batch because of ``reason`` (services/trainer/bounds.py)."""
        self.set_state("waiting")
        with self._lock:
            self._status["waiting_for"] = reason

    def published(self, seconds: float) -> None:
        """A checkpoint was published in ``seconds``; ``/status`` keeps the mean (a synchronous step's part)."""
        self.checkpoint_seconds.observe(seconds)
        with self._lock:
            if self._time_origin is not None:
                self._time["publish"] += seconds
                self._time_until = time.monotonic()
            self._publishes += 1
            self._publish_seconds += seconds
            self._status["publish_s_mean"] = round(self._publish_seconds / self._publishes, 4)

    def set_buffer_failures(self, total: int) -> None:
        with self._lock:
            delta = total - self._status["buffer_failures"]
            self._status["buffer_failures"] = total
        if delta > 0:
            self.buffer_failures.inc(delta)

    def status(self) -> dict[str, Any]:
        with self._lock:
            out = dict(self._status)
            out["samples_trained_by_searcher"] = dict(out["samples_trained_by_searcher"])
            out["time"] = self._time_split()
            return out

    def _time_split(self) -> dict[str, Any]:
        """Seconds by part from the request for the first batch to the end of the last step or publish, that wall
        time, and the busy fraction (the trainer's own work over the wall time: what is not fetching a batch or
        bookkeeping)."""
        if self._time_origin is None:
            return {}
        wall = self._time_until - self._time_origin
        parts = {k: round(v, 3) for k, v in self._time.items()}
        parts["other"] = round(max(0.0, wall - sum(self._time.values())), 3)
        busy = sum(self._time[k] for k in BUSY_PARTS)
        return {"wall_s": round(wall, 3), "seconds": parts, "busy_fraction": round(busy / max(wall, 1e-9), 4)}

    def record(
        self,
        step: int,
        beta: float,
        result: StepResult,
        wait_s: float,
        wait_reason: str | None = None,
        reuse: float | None = None,
        by_searcher: Mapping[str, int] | None = None,
    ) -> dict[str, Any]:
        """Publish one step's figures everywhere; return the row written to the metrics file. ``by_searcher``: the
        step's samples by the searcher that generated them."""
        m = result.metrics
        n = max(1, result.samples)
        staleness_mean = sum(s * c for s, c in result.staleness.items()) / n
        row = {
            "ts": round(time.time(), 3),
            "step": step,
            "loss": m.get("loss"),
            "reward_mean": m.get("reward_mean"),
            "log_Z_mean": m.get("log_Z_mean"),
            "kl": m.get("kl"),
            "beta": beta,
            "lr": result.lr,
            "grad_norm": result.grad_norm,
            "samples": result.samples,
            "prompts": result.prompts,
            "tokens": result.tokens,
            "micro_batches": result.micro_batches,
            "step_s": round(result.seconds, 4),
            "ref_s": round(result.ref_seconds, 4),
            "forward_s": round(result.forward_seconds, 4),
            "backward_s": round(result.backward_seconds, 4),
            "optimizer_s": round(result.optimizer_seconds, 4),
            "wait_s": round(wait_s, 4),
            "wait_reason": wait_reason,
            "reuse": None if reuse is None else round(reuse, 4),
            "samples_per_s": result.samples / max(result.seconds, 1e-9),
            "tokens_per_s": result.tokens / max(result.seconds, 1e-9),
            "staleness_mean": staleness_mean,
            "staleness_hist": {str(k): v for k, v in result.staleness.items()},
            "samples_by_searcher": dict(by_searcher or {}),
        }
        if "mixed_prompts" in m:
            row["mixed_fraction"] = m["mixed_prompts"] / max(1, result.prompts)
        for name in LOSS_METRICS:  # what only some losses or settings report
            if name in m:
                row[name] = m[name]
        self._export(row, result)
        with self._lock:
            self._status.update(
                {
                    k: row[k]
                    for k in (
                        "step",
                        "loss",
                        "reward_mean",
                        "log_Z_mean",
                        "kl",
                        "beta",
                        "lr",
                        "samples_per_s",
                        "tokens_per_s",
                        "wait_s",
                        "staleness_mean",
                        "reuse",
                    )
                }
            )
            self._status["waiting_for"] = None
            self._status["staleness"] = row["staleness_hist"]
            if self._time_origin is None:  # from when the first batch was asked for
                self._time_origin = time.monotonic() - result.seconds - wait_s
            for part, seconds in (
                ("fetch", wait_s),
                ("reference", result.ref_seconds),
                ("forward", result.forward_seconds),
                ("backward", result.backward_seconds),
                ("optimizer", result.optimizer_seconds),
            ):
                self._time[part] += seconds
            self._time_until = time.monotonic()
            trained = self._status["samples_trained_by_searcher"]
            for searcher, count in (by_searcher or {}).items():
                trained[searcher] = trained.get(searcher, 0) + count
        if self.tracker is not None:
            self.tracker.scalars(step, {k: v for k, v in row.items() if k not in ("ts", "step")}, prefix="trainer")
            self.tracker.histogram(step, "trainer/staleness", result.staleness)
        if self.metrics_file is not None:
            self.metrics_file.parent.mkdir(parents=True, exist_ok=True)
            with self.metrics_file.open("a") as f:
                f.write(json.dumps(row) + "\n")
        log.info(self.progress_line(row), extra={"fields": {"event": "step", **row}})
        return row

    def _export(self, row: dict[str, Any], result: StepResult) -> None:
        for name in ("step", "beta", "lr", "grad_norm", "samples_per_s", "tokens_per_s", "staleness_mean"):
            self.g[name].set(row[name])
        for name in ("loss", "reward_mean", "log_Z_mean", "kl", "mixed_fraction", "reuse", *LOSS_METRICS):
            if row.get(name) is not None and name in self.g:
                self.g[name].set(row[name])
        self.samples_total.inc(result.samples)
        self.tokens_total.inc(result.tokens)
        self.step_seconds.observe(result.seconds)
        for staleness, count in result.staleness.items():
            for _ in range(count):
                self.staleness.observe(staleness)

    def progress_line(self, row: dict[str, Any]) -> str:
        total = f"/{self.max_steps}" if self.max_steps else ""
        parts = [f"step {row['step']}{total}", f"loss {row['loss']:.4g}", f"R {row['reward_mean']:.3f}"]
        if row.get("log_Z_mean") is not None:
            parts.append(f"logZ {row['log_Z_mean']:.3g}")
        parts += [
            f"kl {row['kl']:.3g}",
            f"beta {row['beta']:.3g}",
            f"{row['tokens_per_s']:.0f} tok/s",
            f"wait {row['wait_s']:.2f}s" + (f" ({row['wait_reason']})" if row.get("wait_reason") else ""),
            f"stale {row['staleness_mean']:.1f}",
        ]
        if row.get("reuse") is not None:
            parts.append(f"reuse {row['reuse']:.2f}")
        return " | ".join(parts)
