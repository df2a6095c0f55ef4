"""The trainer's objectives: VarGrad Trajectory Balance, its on-policy baseline, and the beta schedule.

Trajectory Balance (Bartoldson et al., arXiv 2503.18929; docs/algorithm.md §2), for a
prompt x with samples y_1..y_K::

    log_reward_i = log_ref_i + r_i / beta                  # log R(y_i; x), the target
    log_Z(x)     = mean_i [ log_reward_i - log_pi_i ]      # VarGrad estimate, stop-gradient
    loss         = mean_i ( log_Z(x) + log_pi_i - log_reward_i )^2

``log_pi`` and ``log_ref`` are summed completion log-probs under logits / T
(:mod:`tba.model.logprobs`). Samples are grouped by an explicit prompt index,
never by their position in the batch, so any order and any mix of group sizes
give the same loss. No importance ratio: TB is off-policy by construction.

Every loss here is a sum over the samples it is given divided by ``denom`` (the
number of samples in the whole optimizer batch), so the losses of micro-batches
that each hold complete prompts add up to the loss of the whole batch, and so
do their gradients and their metrics.
"""

from __future__ import annotations

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

    @property
    def num_prompts(self) -> int:
        return int(self.prompt_index.max().item()) + 1 if self.prompt_index.numel() else 0


@dataclass
class LossOutput:
    """The loss to backpropagate, and metrics as sums over samples / denom (so they add across micro-batches)."""

    loss: Tensor
    metrics: dict[str, float] = field(default_factory=dict)


def group_mean(values: Tensor, prompt_index: Tensor, num_prompts: int) -> Tensor:
    """Per-prompt mean of ``values`` (N,), returned per prompt (G,)."""
    sums = torch.zeros(num_prompts, dtype=values.dtype, device=values.device).index_add_(0, prompt_index, values)
    counts = torch.bincount(prompt_index, minlength=num_prompts).to(values.dtype)
    return sums / counts


def group_std(values: Tensor, prompt_index: Tensor, num_prompts: int) -> Tensor:
    """Per-prompt population standard deviation (G,)."""
    mean = group_mean(values, prompt_index, num_prompts)
    return group_mean((values - mean[prompt_index]) ** 2, prompt_index, num_prompts).sqrt()


def _common_metrics(x: LossInput, denom: int) -> dict[str, float]:
    kl = x.log_pi.detach() - x.log_ref  # (N,) single-sample estimate of KL(pi || pi_ref)
    spread = group_std(x.reward, x.prompt_index, x.num_prompts)
    return {
        "reward_mean": float(x.reward.sum()) / denom,
        "kl": float(kl.sum()) / denom,
        "log_pi_mean": float(x.log_pi.detach().sum()) / denom,
        "samples": float(x.reward.numel()),
        # Prompts whose samples differ in reward: the only ones that carry a reward signal (a count).
        "mixed_prompts": float((spread > 0).sum()),
    }


def tb_loss(x: LossInput, beta: float, denom: int | None = None) -> LossOutput:
    """VarGrad Trajectory Balance over complete prompts (docs/algorithm.md §2)."""
    N = x.log_pi.numel()
    denom = N if denom is None else denom
    G = x.num_prompts
    log_reward = x.log_ref + x.reward / beta  # (N,) log R(y_i; x)
    log_Z = group_mean(log_reward - x.log_pi.detach(), x.prompt_index, G)  # (G,) stop-gradient
    residual = log_Z[x.prompt_index] + x.log_pi - log_reward  # (N,)
    loss = (residual**2).sum() / denom
    metrics = _common_metrics(x, denom)
    metrics["loss"] = float(loss.detach())
    metrics["log_Z_mean"] = float(log_Z[x.prompt_index].sum()) / denom  # sample-weighted mean over prompts
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


def make_loss(name: str) -> LossFn:
    if name not in LOSSES:
        raise ValueError(f"unknown loss {name!r}; known: {', '.join(sorted(LOSSES))}")
    return LOSSES[name]


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
