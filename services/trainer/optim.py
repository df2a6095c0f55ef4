"""AdamW and its learning-rate schedule (linear warmup, then constant, linear decay, or warmup-stable-decay; and a
decay with the samples trained below it)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from tba.settings import TrainerSettings


@dataclass(frozen=True)
class LRSchedule:
    """Multiplier of the peak learning rate after ``step`` optimizer steps (0-based, as LambdaLR counts)
    and ``seconds`` of running.

    - warmup: linear from 1/(warmup+1) up to 1 over ``warmup_steps``;
    - constant: 1 afterwards;
    - linear: from 1 down to 0 at the end of the run;
    - wsd (warmup-stable-decay, the GSM8K runs): 1 until the last ``decay_fraction`` of the run,
      then linearly down to 0.

    The end of the run is ``max_steps`` or ``max_seconds``, whichever comes first: each gives a
    multiplier and the smaller one applies, so a run with a wall-clock budget (``tba up --minutes``)
    decays to 0 when its time is up, however many steps it managed.

    A decay tied to the data trained on (``data_decay_start`` set) applies below any of these: 1 until step
    ``data_decay_start``, then linearly down to ``min_ratio`` over ``data_decay_steps``, held there. Its steps
    stand for samples trained (the settings give it in samples), so the rate after the same data is the same
    whatever the budget and however fast the run trains: a fast asynchronous trainer and a slow synchronous
    one decay after the same number of samples, not at the same second.
    """

    kind: str = "constant"
    warmup_steps: int = 0
    max_steps: int | None = None
    decay_fraction: float = 0.1
    max_seconds: float | None = None
    data_decay_start: int | None = None
    data_decay_steps: int = 1
    min_ratio: float = 0.0

    @classmethod
    def from_settings(cls, s: TrainerSettings) -> LRSchedule:
        """The trainer's schedule; the data decay's samples as steps of P prompts x K samples."""
        per_step = s.prompts_per_step * s.train_samples_per_prompt
        start = s.lr_decay_start_samples
        return cls(
            s.lr_schedule,
            s.lr_warmup_steps,
            s.max_steps,
            s.lr_decay_fraction,
            s.max_seconds,
            data_decay_start=None if start is None else round(start / per_step),
            data_decay_steps=round(s.lr_decay_samples / per_step),
            min_ratio=s.lr_min_ratio,
        )

    def __call__(self, step: int, seconds: float = 0.0) -> float:
        if step < self.warmup_steps:
            return (step + 1) / (self.warmup_steps + 1)
        return min(self._run_factor(step, seconds), self._data_factor(step))

    def _data_factor(self, step: int) -> float:
        if self.data_decay_start is None:
            return 1.0
        done = min(1.0, max(0.0, (step - self.data_decay_start) / max(1, self.data_decay_steps)))
        return 1.0 - (1.0 - self.min_ratio) * done

    def _run_factor(self, step: int, seconds: float) -> float:
        if self.kind == "constant":
            return 1.0
        if self.kind not in ("linear", "wsd"):
            raise ValueError(f"unknown lr schedule {self.kind!r}")
        if self.max_steps is None and self.max_seconds is None:
            raise ValueError(f"the {self.kind} schedule needs max_steps or max_seconds")
        factor = 1.0
        if self.max_steps is not None:
            factor = self._decay(
                step - self.warmup_steps,
                self.max_steps - self.warmup_steps,
                round(self.decay_fraction * self.max_steps),
            )
        if self.max_seconds is not None:
            factor = min(factor, self._decay(seconds, self.max_seconds, self.decay_fraction * self.max_seconds))
        return factor

    def _decay(self, done: float, total: float, decay_span: float) -> float:
        """1 -> 0 over the whole of ``total`` (linear) or over its last ``decay_span`` (wsd)."""
        span = max(1e-9, total) if self.kind == "linear" else max(1e-9, min(decay_span, total))
        return min(1.0, max(0.0, (total - done) / span))


def build_optimizer(
    model: torch.nn.Module,
    lr: float,
    weight_decay: float,
    schedule: LRSchedule,
    clock: Callable[[], float] = lambda: 0.0,
):
    """AdamW over the trainable parameters, and the LambdaLR that applies ``schedule``; ``clock`` gives the
    seconds the run has been going (the time-based part of the schedule)."""
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda=lambda step: schedule(step, clock()))
    return optimizer, scheduler


def set_step(scheduler: torch.optim.lr_scheduler.LambdaLR, step: int) -> None:
    """Put a restored schedule at ``step`` and its learning rates with it: the optimizer file a checkpoint
    carries may be from an earlier step than its weights (weights-only publishing)."""
    scheduler.last_epoch = step
    groups = scheduler.optimizer.param_groups
    for group, base, factor in zip(groups, scheduler.base_lrs, scheduler.lr_lambdas, strict=True):
        group["lr"] = base * factor(step)
