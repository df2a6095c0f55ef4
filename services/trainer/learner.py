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
from typing import Any

import torch

from services.trainer.batching import MicroBatch, Row, plan_micro_batches, staleness_histogram
from services.trainer.distributed import ONE_PROCESS, Ranks, split_by_prompt
from services.trainer.losses import LossFn, LossInput
from services.trainer.reference import TrainerReference
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
    # Where ``seconds`` went: the reference pass (TBA_REF_PASS=trainer), the policy's forward (log-probs and
    # loss), its backward, and the optimizer (clipping and the update); the rest is batch planning.
    ref_seconds: float = 0.0
    forward_seconds: float = 0.0
    backward_seconds: float = 0.0
    optimizer_seconds: float = 0.0


class Learner:
    """Owns the policy and its optimizer; :meth:`step` is the whole gradient update."""

    def __init__(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        scheduler,
        loss_fn: LossFn,
        *,
        temperature: float,
        pad_id: int,
        token_budget: int,
        grad_clip: float | None,
        compute_dtype: str = "float32",
        prefix_sharing: bool = True,
        ranks: Ranks = ONE_PROCESS,
        reference: TrainerReference | None = None,
    ) -> None:
        self.model = model
        self.optimizer = optimizer
        self.scheduler = scheduler
        self.loss_fn = loss_fn
        self.temperature = temperature
        self.pad_id = pad_id
        self.token_budget = token_budget
        self.grad_clip = grad_clip
        self.device = next(model.parameters()).device
        config: Any = model.config  # a transformers model's (FSDP and peft keep it)
        self.vocab_size = int(config.vocab_size)  # token ids the policy takes, for validating batches
        self.max_length = int(getattr(config, "max_position_embeddings", 1 << 30))  # positions it takes
        self.compute_dtype = compute_dtype
        self.ranks = ranks  # under torchrun: this rank computes its share of each batch (distributed.py)
        self.reference = reference  # log pi_ref of the samples that arrive without it (TBA_REF_PASS=trainer)
        # The current step's time by part (StepResult's fields of the same names).
        self.ref_seconds = self.forward_seconds = self.backward_seconds = 0.0
        # A micro-batch holds whole prompts: each prompt and its completions' shared prefixes computed once.
        self.logprobs = shared_prefix_logprobs if prefix_sharing and takes_tree_mask(model) else sequence_logprobs

    def accumulate(
        self, micro: list[MicroBatch], beta: float, denom: int, at_least: int = 0
    ) -> tuple[dict[str, float], int, int]:
        """Forward and backward every micro-batch; gradients add up to those of the whole batch.

        ``denom``: the whole batch's sample count (under torchrun ``micro`` holds one rank's share of it);
        ``at_least``: how many forwards to run (the other ranks' most), the extra ones on a filler row
        weighted zero, so that every rank takes part in every gather of the sharded weights."""
        totals: dict[str, float] = defaultdict(float)
        tokens = prompts = 0
        for mb in micro:
            log_ref = self.log_ref(mb)
            start = time.perf_counter()
            with autocast(self.device, self.compute_dtype):
                log_pi = self.logprobs(self.model, mb.prompts, mb.completions, self.temperature, self.pad_id, mb.scored)
            x = LossInput(
                log_pi=log_pi.float(),
                log_ref=log_ref,
                reward=mb.reward.to(self.device),
                prompt_index=mb.prompt_index.to(self.device),
                log_behaviour=None if mb.log_behaviour.isnan().any() else mb.log_behaviour.to(self.device),
            )
            out = self.loss_fn(x, beta, denom)
            backward_start = time.perf_counter()
            self.forward_seconds += backward_start - start
            (out.loss * self.ranks.world).backward()  # FSDP averages the ranks' gradients: make it their sum
            self.backward_seconds += time.perf_counter() - backward_start
            for k, v in out.metrics.items():
                totals[k] += v
            tokens += mb.tokens
            prompts += x.num_prompts  # whole prompts in each micro-batch
        for _ in range(len(micro), at_least):
            with autocast(self.device, self.compute_dtype):
                filler = self.logprobs(self.model, [[self.pad_id]], [[self.pad_id]], self.temperature, self.pad_id)
            (filler.float().sum() * 0.0).backward()
        totals["prompts"] = float(prompts)
        return dict(totals), tokens, max(len(micro), at_least)

    def log_ref(self, mb: MicroBatch) -> torch.Tensor:
        """The micro-batch's log pi_ref: as the searchers sent it, else (NaN there) computed here, with the
        policy's log-prob function and precision."""
        log_ref = mb.log_ref.to(self.device)
        missing = torch.isnan(log_ref)
        if not bool(missing.any()):
            return log_ref
        if self.reference is None:
            raise ValueError("samples without a reference log-prob, and this learner has no reference model")
        start = time.perf_counter()
        with self.reference.model() as ref, autocast(self.device, self.compute_dtype):
            computed = self.logprobs(ref, mb.prompts, mb.completions, self.temperature, self.pad_id, mb.scored)
        self.ref_seconds += time.perf_counter() - start
        return torch.where(missing, computed.float(), log_ref)

    def step(self, rows: list[Row], beta: float) -> StepResult:
        """Take one optimizer step on ``rows`` (complete prompts) with KL coefficient ``beta``.

        Under torchrun every rank is given the whole batch and computes the loss on its share of the prompts."""
        if not rows:
            raise ValueError("an optimizer step needs at least one sample")
        start = time.perf_counter()
        self.ref_seconds = self.forward_seconds = self.backward_seconds = 0.0
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        if self.ranks.distributed:
            micro = plan_micro_batches(split_by_prompt(rows, self.ranks.world)[self.ranks.rank], self.token_budget)
            most = max(self.ranks.all_gather(len(micro)))
            metrics, tokens, n_micro = _summed(self.ranks.all_gather(self.accumulate(micro, beta, len(rows), most)))
        else:
            metrics, tokens, n_micro = self.accumulate(plan_micro_batches(rows, self.token_budget), beta, len(rows))
        optimizer_start = time.perf_counter()
        grad_norm = self._clip_gradients()
        lr = self.optimizer.param_groups[0]["lr"]
        if math.isfinite(grad_norm):
            self.optimizer.step()
        else:
            metrics["skipped_nonfinite"] = 1.0
            self.optimizer.zero_grad(set_to_none=True)
        self.scheduler.step()
        optimizer_seconds = time.perf_counter() - optimizer_start
        return StepResult(
            metrics=metrics,
            samples=len(rows),
            prompts=int(metrics["prompts"]),
            tokens=tokens,
            micro_batches=n_micro,
            seconds=time.perf_counter() - start,
            grad_norm=grad_norm,
            lr=lr,
            staleness=staleness_histogram(rows),
            ref_seconds=self.ref_seconds,
            forward_seconds=self.forward_seconds,
            backward_seconds=self.backward_seconds,
            optimizer_seconds=optimizer_seconds,
        )

    def _clip_gradients(self) -> float:
        """The whole gradient's norm (across shards under FSDP), clipped to ``grad_clip``."""
        params = [p for g in self.optimizer.param_groups for p in g["params"]]
        grads = [p.grad for p in params if p.grad is not None]
        norm = torch.nn.utils.get_total_norm(grads, foreach=True)
        if hasattr(norm, "full_tensor"):  # a DTensor: each rank holds the norm of its shards only
            norm = norm.full_tensor()
        if self.grad_clip is not None:
            torch.nn.utils.clip_grads_with_norm_(params, self.grad_clip, norm, foreach=True)
        return float(norm)


def _summed(per_rank: list[tuple[dict[str, float], int, int]]) -> tuple[dict[str, float], int, int]:
    """The ranks' metrics (sums over their samples / the whole batch's count) and tokens added up."""
    metrics: dict[str, float] = defaultdict(float)
    for rank_metrics, _, _ in per_rank:
        for k, v in rank_metrics.items():
            metrics[k] += v
    return dict(metrics), sum(t for _, t, _ in per_rank), per_rank[0][2]
