"""One optimizer step: micro-batches, tempered policy log-probs, loss, accumulated gradients, AdamW.

The policy's log-probs are :func:`tba.model.logprobs.sequence_logprobs`, the
same definition the searchers use for the reference model, so log pi and
log pi_ref in the loss are computed the same way (logits / T, padding masked);
by default through :func:`~tba.model.logprobs.shared_prefix_logprobs`, which
returns the same sums (and gradients) computing each prompt once per micro-batch.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections import defaultdict
from dataclasses import dataclass, field

import torch

from services.trainer.batching import Row, plan_micro_batches, staleness_histogram
from services.trainer.losses import LossFn, LossInput
from tba.model.logprobs import sequence_logprobs, shared_prefix_logprobs, takes_tree_mask

AUTOCAST_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16}


def autocast(device: torch.device, compute_dtype: str):
    """The forward's precision: fp32 master weights, computed under autocast in bf16/fp16 (else as they are)."""
    dtype = AUTOCAST_DTYPES.get(compute_dtype)
    return contextlib.nullcontext() if dtype is None else torch.autocast(device_type=device.type, dtype=dtype)


@dataclass
class StepResult:
    """What one optimizer step did: summed metrics, throughput figures and the batch's staleness."""

    metrics: dict[str, float]
    samples: int
    prompts: int
    tokens: int
    micro_batches: int
    seconds: float
    grad_norm: float
    lr: float
    staleness: dict[int, int] = field(default_factory=dict)


class Learner:
    """Owns the policy and its optimizer; :meth:`step` is the whole gradient update."""

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, scheduler, loss_fn: LossFn,
                 *, temperature: float, pad_id: int, token_budget: int, grad_clip: float | None,
                 compute_dtype: str = "float32", prefix_sharing: bool = True) -> None:
        self.model = model
        self.optimizer = optimizer
        self.scheduler = scheduler
        self.loss_fn = loss_fn
        self.temperature = temperature
        self.pad_id = pad_id
        self.token_budget = token_budget
        self.grad_clip = grad_clip
        self.device = next(model.parameters()).device
        self.compute_dtype = compute_dtype
        # A micro-batch holds whole prompts: each prompt and its completions' shared prefixes computed once.
        self.logprobs = shared_prefix_logprobs if prefix_sharing and takes_tree_mask(model) else sequence_logprobs

    def accumulate(self, rows: list[Row], beta: float) -> tuple[dict[str, float], int, int]:
        """Forward and backward every micro-batch; gradients add up to those of the whole batch."""
        denom = len(rows)
        totals: dict[str, float] = defaultdict(float)
        micro = plan_micro_batches(rows, self.token_budget)
        tokens = 0
        for mb in micro:
            with autocast(self.device, self.compute_dtype):
                log_pi = self.logprobs(self.model, mb.prompts, mb.completions, self.temperature, self.pad_id)
            x = LossInput(log_pi=log_pi.float(), log_ref=mb.log_ref.to(self.device),
                          reward=mb.reward.to(self.device), prompt_index=mb.prompt_index.to(self.device))
            out = self.loss_fn(x, beta, denom)
            out.loss.backward()
            for k, v in out.metrics.items():
                totals[k] += v
            tokens += mb.tokens
        totals["prompts"] = float(len({r.prompt_key for r in rows}))
        return dict(totals), tokens, len(micro)

    def step(self, rows: list[Row], beta: float) -> StepResult:
        """Take one optimizer step on ``rows`` (complete prompts) with KL coefficient ``beta``."""
        if not rows:
            raise ValueError("an optimizer step needs at least one sample")
        start = time.perf_counter()
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        metrics, tokens, n_micro = self.accumulate(rows, beta)
        params = [p for g in self.optimizer.param_groups for p in g["params"]]
        max_norm = self.grad_clip if self.grad_clip is not None else math.inf
        grad_norm = float(torch.nn.utils.clip_grad_norm_(params, max_norm))
        lr = self.optimizer.param_groups[0]["lr"]
        if math.isfinite(grad_norm):
            self.optimizer.step()
        else:
            metrics["skipped_nonfinite"] = 1.0
            self.optimizer.zero_grad(set_to_none=True)
        self.scheduler.step()
        return StepResult(
            metrics=metrics, samples=len(rows), prompts=int(metrics["prompts"]), tokens=tokens,
            micro_batches=n_micro, seconds=time.perf_counter() - start, grad_norm=grad_norm, lr=lr,
            staleness=staleness_histogram(rows),
        )
