"""AdamW and its learning-rate schedule (linear warmup, then constant, linear decay, or warmup-stable-decay)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch


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
    """

    kind: str = "constant"
    warmup_steps: int = 0
    max_steps: int | None = None
    decay_fraction: float = 0.1
    max_seconds: float | None = None

    def __call__(self, step: int, seconds: float = 0.0) -> float:
        if step < self.warmup_steps:
            return (step + 1) / (self.warmup_steps + 1)
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
