"""AdamW and its learning-rate schedule (linear warmup, then constant, linear decay, or warmup-stable-decay)."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class LRSchedule:
    """Multiplier of the peak learning rate after ``step`` optimizer steps (0-based, as LambdaLR counts).

    - warmup: linear from 1/(warmup+1) up to 1 over ``warmup_steps``;
    - constant: 1 afterwards;
    - linear: from 1 down to 0 at ``max_steps``;
    - wsd (warmup-stable-decay, the GSM8K runs): 1 until the last ``decay_fraction`` of ``max_steps``,
      then linearly down to 0.
    """

    kind: str = "constant"
    warmup_steps: int = 0
    max_steps: int | None = None
    decay_fraction: float = 0.1

    def __call__(self, step: int) -> float:
        if step < self.warmup_steps:
            return (step + 1) / (self.warmup_steps + 1)
        if self.kind == "constant":
            return 1.0
        if self.max_steps is None:
            raise ValueError(f"the {self.kind} schedule needs max_steps")
        if self.kind == "linear":
            span = max(1, self.max_steps - self.warmup_steps)
            return max(0.0, 1.0 - (step - self.warmup_steps) / span)
        if self.kind == "wsd":
            decay_steps = max(1, round(self.decay_fraction * self.max_steps))
            decay_start = max(self.warmup_steps, self.max_steps - decay_steps)
            if step < decay_start:
                return 1.0
            return max(0.0, 1.0 - (step - decay_start) / max(1, self.max_steps - decay_start))
        raise ValueError(f"unknown lr schedule {self.kind!r}")


def build_optimizer(model: torch.nn.Module, lr: float, weight_decay: float, schedule: LRSchedule):
    """AdamW over the trainable parameters, and the LambdaLR that applies ``schedule``."""
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda=schedule)
    return optimizer, scheduler
