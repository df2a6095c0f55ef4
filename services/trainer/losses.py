"""The trainer's objectives: VarGrad Trajectory Balance, its on-policy baseline, and the beta schedule.

Trajectory Balance (Bartoldson et al., arXiv 2503.18929; docs/algorithm.md §2), for a
prompt x with samples y_1..y_K::

    log_reward_i = log_ref_i + r_i / beta                  # log R(y_i; x), the target
    log_Z(x)     = mean_i [ log_reward_i - log_pi_i ]      # VarGrad estimate, stop-gradient
    loss         = mean_i ( log_Z(x) + log_pi_i - log_reward_i )^2

``log_pi`` and ``log_ref`` are summed completion log-probs under logits / T
(:mod:`tba.model.logprobs`). Samples are grouped by an explicit prompt index,
never by their position in the batch, so any order and any mix of group sizes
give the same loss. TB is off-policy by construction: it needs no importance
ratio. Optionally (``importance_clip``, TBA_IMPORTANCE_CLIP) each sample's
squared residual, and its share of log Z, is weighted by the clipped ratio
w_i = clip(pi_theta(y_i) / mu(y_i), 1 - eps, 1 + eps) of the current policy to
the one that generated it (FlowRL's correction), which leans a stale batch
towards what the current policy would have drawn.

Every loss here is a sum over the samples it is given divided by ``denom`` (the
number of samples in the whole optimizer batch), so the losses of micro-batches
that each hold complete prompts add up to the loss of the whole batch, and so
do their gradients and their metrics.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import Tensor


@dataclass(frozen=True)
class LossInput:
    """One micro-batch of complete prompts; every tensor has shape (N,)."""

    log_pi: Tensor  # log pi_theta(y_i | x), with gradient
    log_ref: Tensor  # log pi_ref(y_i | x), from the searchers
    reward: Tensor  # r_i
    prompt_index: Tensor  # long, in [0, G): which prompt sample i belongs to
    log_behaviour: Tensor | None = None  # log mu(y_i | x), the generating policy's, as its searcher sent it

    @property
    def num_prompts(self) -> int:
        return int(self.prompt_index.max().item()) + 1 if self.prompt_index.numel() else 0


@dataclass
class LossOutput:
    """The loss to backpropagate, and metrics as sums over samples / denom (so they add across micro-batches)."""

    loss: Tensor
    metrics: dict[str, float] = field(default_factory=dict)


def group_sum(values: Tensor, prompt_index: Tensor, num_prompts: int) -> Tensor:
    """Per-prompt sum of ``values`` (N,), returned per prompt (G,)."""
    return torch.zeros(num_prompts, dtype=values.dtype, device=values.device).index_add_(0, prompt_index, values)


def group_mean(values: Tensor, prompt_index: Tensor, num_prompts: int) -> Tensor:
    """Per-prompt mean of ``values`` (N,), returned per prompt (G,)."""
    counts = torch.bincount(prompt_index, minlength=num_prompts).to(values.dtype)
    return group_sum(values, prompt_index, num_prompts) / counts


def group_std(values: Tensor, prompt_index: Tensor, num_prompts: int) -> Tensor:
    """Per-prompt population standard deviation (G,)."""
    mean = group_mean(values, prompt_index, num_prompts)
    return group_mean((values - mean[prompt_index]) ** 2, prompt_index, num_prompts).sqrt()


def importance_weights(log_pi: Tensor, log_behaviour: Tensor, clip: float) -> tuple[Tensor, Tensor]:
    """w_i = clip(pi_theta(y_i) / mu(y_i), 1 - clip, 1 + clip) without gradient, and which samples the clip
    bound (both (N,)).

    The clip bounds what one sample can weigh however far the policy has moved since it was generated,
    and absorbs the small disagreement between the engine's and the trainer's arithmetic on fresh samples."""
    lo, hi = math.log1p(-clip), math.log1p(clip)
    log_ratio = log_pi.detach() - log_behaviour
    return log_ratio.clamp(lo, hi).exp(), (log_ratio < lo) | (log_ratio > hi)


def _common_metrics(x: LossInput, denom: int) -> dict[str, float]:
    kl = x.log_pi.detach() - x.log_ref  # (N,) single-sample estimate of KL(pi || pi_ref)
    spread = group_std(x.reward, x.prompt_index, x.num_prompts)
    metrics = {
        "reward_mean": float(x.reward.sum()) / denom,
        "kl": float(kl.sum()) / denom,
        "log_pi_mean": float(x.log_pi.detach().sum()) / denom,
        "samples": float(x.reward.numel()),
        # Prompts whose samples differ in reward: the only ones that carry a reward signal (a count).
        "mixed_prompts": float((spread > 0).sum()),
    }
    if x.log_behaviour is not None:
        # How far the policy trained is from the one that generated the batch: log pi_theta - log mu per sample
        # (on fresh samples, the engine's and the trainer's arithmetic disagreeing).
        off_policy = (x.log_pi.detach() - x.log_behaviour).abs()
        metrics["behaviour_log_ratio_abs"] = float(off_policy.sum()) / denom
    return metrics


def tb_loss(x: LossInput, beta: float, denom: int | None = None, importance_clip: float | None = None) -> LossOutput:
    """VarGrad Trajectory Balance over complete prompts (docs/algorithm.md §2), each sample weighted by its
    clipped importance ratio where ``importance_clip`` is set (log Z then the weighted mean that minimises the
    weighted loss)."""
    N = x.log_pi.numel()
    denom = N if denom is None else denom
    G = x.num_prompts
    weight, clipped = torch.ones_like(x.reward), None
    if importance_clip is not None:
        if x.log_behaviour is None:
            raise ValueError("importance weights need the behaviour policy's log-probs (LossInput.log_behaviour)")
        weight, clipped = importance_weights(x.log_pi, x.log_behaviour, importance_clip)
    log_reward = x.log_ref + x.reward / beta  # (N,) log R(y_i; x)
    target = group_sum(weight * (log_reward - x.log_pi.detach()), x.prompt_index, G)
    log_Z = target / group_sum(weight, x.prompt_index, G)  # (G,) stop-gradient
    residual = log_Z[x.prompt_index] + x.log_pi - log_reward  # (N,)
    loss = (weight * residual**2).sum() / denom
    metrics = _common_metrics(x, denom)
    metrics["loss"] = float(loss.detach())
    metrics["log_Z_mean"] = float(log_Z[x.prompt_index].sum()) / denom  # sample-weighted mean over prompts
    if clipped is not None:
        metrics["importance_weight_mean"] = float(weight.sum()) / denom
        metrics["importance_clipped"] = float(clipped.sum()) / denom  # the fraction of samples at a bound
    return LossOutput(loss=loss, metrics=metrics)


def grpo_loss(
    x: LossInput, beta: float, denom: int | None = None, scale_by_std: bool = True, eps: float = 1e-4
) -> LossOutput:
    """On-policy baseline: REINFORCE with a group-normalised advantage on the KL-regularised reward.

    u_i = r_i - beta (log_pi_i - log_ref_i) (detached), A_i = (u_i - mean_g u) / (std_g u + eps),
    loss = -mean_i A_i log_pi_i. The trainer takes one optimizer step per batch of current-version
    samples in sync mode, so GRPO's ratio is exactly 1 and its clipping never acts: this is GRPO
    (Shao et al. 2024) with the KL folded into the reward, as in RLOO/PPO-RLHF.
    """
    N = x.log_pi.numel()
    denom = N if denom is None else denom
    G = x.num_prompts
    u = x.reward - beta * (x.log_pi.detach() - x.log_ref)  # (N,)
    A = u - group_mean(u, x.prompt_index, G)[x.prompt_index]  # (N,)
    if scale_by_std:
        A = A / (group_std(u, x.prompt_index, G)[x.prompt_index] + eps)
    loss = -(A * x.log_pi).sum() / denom
    metrics = _common_metrics(x, denom)
    metrics["loss"] = float(loss.detach())
    metrics["advantage_abs_mean"] = float(A.abs().sum()) / denom
    return LossOutput(loss=loss, metrics=metrics)


LossFn = Callable[[LossInput, float, int | None], LossOutput]
LOSSES: dict[str, LossFn] = {"tb": tb_loss, "grpo": grpo_loss}


def make_loss(name: str, importance_clip: float | None = None) -> LossFn:
    """The loss ``name``; with ``importance_clip``, TB weighted by the clipped importance ratios."""
    if name not in LOSSES:
        raise ValueError(f"unknown loss {name!r}; known: {', '.join(sorted(LOSSES))}")
    if importance_clip is None:
        return LOSSES[name]
    if name != "tb":
        raise ValueError(f"importance weights apply to the TB loss, not {name!r}")
    return functools.partial(tb_loss, importance_clip=importance_clip)


@dataclass(frozen=True)
class BetaSchedule:
    """beta(u) = beta_0 + (beta_final - beta_0) * min(1, (u - 1) / T_anneal), u = 1, 2, ... (docs/algorithm.md §2)."""

    beta_0: float
    beta_final: float
    T_anneal: int

    def __call__(self, u: int) -> float:
        if u < 1:
            raise ValueError(f"optimizer steps count from 1, got u={u}")
        if self.T_anneal == 0:
            return self.beta_0
        return self.beta_0 + (self.beta_final - self.beta_0) * min(1.0, (u - 1) / self.T_anneal)
