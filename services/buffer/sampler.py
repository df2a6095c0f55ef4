"""The sampling rule of docs/algorithm.md §4: recency with probability m, else reward.

For each of the P prompt slots independently, with probability m the **recency**
branch takes a prompt (without replacement) among those holding samples of the
newest versions, ``version >= newest_stored - recent_versions + 1``, and draws K
of those samples uniformly; otherwise, or when no recent prompt is left, the
**reward** branch takes any eligible prompt (without replacement) and draws K of
its samples with probability softmax(inv_temp · reward). A prompt appears at most
once per batch. Samples are drawn without replacement when the prompt has at least
K candidates (for the reward branch, sequentially in proportion to the weights,
i.e. Plackett-Luce via Gumbel top-K, so the first draw is exactly the softmax),
i.i.d. with replacement otherwise. ``max_staleness`` drops samples older than
``trainer_version - max_staleness``.

``only_version`` (sync mode) is the on-policy draw instead: the batch's prompts are those
holding samples of that version, and each prompt's K samples are drawn uniformly, without
replacement, from the samples *as generated*: a completion generated c times at that version
counts c times (the store keeps each distinct completion once, with its copies). When K equals
the searchers' samples per prompt, a prompt's group is exactly what the policy generated.

Cost of a call: prompts are drawn by rank from sorted sets (O(log N) each, in one
Lua script), each chosen prompt's index is read whole (at most the per-prompt
capacity), then K records per prompt: O(P log N + P · capacity + P · K),
whatever the number of stored samples.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from services.buffer.store import BufferStore, PromptView, decode_record
from tba.schemas import SCHEMA_VERSION, SampleRequest

RECENCY, REWARD, ON_POLICY = "recency", "reward", "on_policy"


class NotEnoughPrompts(Exception):
    """Fewer eligible distinct prompts than asked: the caller should wait and retry (HTTP 409)."""


class BufferChanging(Exception):
    """Concurrent writes kept invalidating the draw; retrying later will succeed (HTTP 503)."""


@dataclass(frozen=True)
class Thresholds:
    """Which samples each branch may use: version >= low (and == exact when set)."""

    recency_low: float
    reward_low: float
    exact: int | None

    def eligible(self, versions: Sequence[int], branch: str) -> list[int]:
        if self.exact is not None:
            return [i for i, v in enumerate(versions) if v == self.exact]
        low = self.recency_low if branch == RECENCY else self.reward_low
        return [i for i, v in enumerate(versions) if v >= low]


def thresholds(req: SampleRequest, newest: int) -> Thresholds:
    reward_low = -math.inf if req.max_staleness is None else req.trainer_version - req.max_staleness
    return Thresholds(recency_low=max(newest - req.recent_versions + 1, reward_low), reward_low=reward_low,
                      exact=req.only_version)


def draw_branches(rng: random.Random, num_prompts: int, m: float) -> list[str]:
    """One independent Bernoulli(m) per slot: recency or reward."""
    return [RECENCY if rng.random() < m else REWARD for _ in range(num_prompts)]


def softmax(x: Sequence[float], inv_temp: float) -> list[float]:
    z = [inv_temp * r for r in x]
    top = max(z)
    w = [math.exp(v - top) for v in z]
    s = sum(w)
    return [v / s for v in w]


def choose_samples(rng: random.Random, candidates: Sequence[int], rewards: Sequence[float], k: int,
                   branch: str, inv_temp: float) -> list[int]:
    """K indices among ``candidates``: uniform (recency) or softmax(inv_temp · reward) (reward)."""
    n = len(candidates)
    if branch == RECENCY or inv_temp == 0.0:
        if n >= k:
            return rng.sample(list(candidates), k)
        return rng.choices(list(candidates), k=k)
    p = softmax([rewards[i] for i in candidates], inv_temp)
    if n < k:
        return rng.choices(list(candidates), weights=p, k=k)
    # Exponential races (Gumbel top-K): arrival E_j / p_j, E_j ~ Exp(1); the first K to
    # arrive are a sequential draw without replacement in proportion to p.
    arrival = [rng.expovariate(1.0) / pj if pj > 0 else math.inf for pj in p]
    order = sorted(range(n), key=lambda j: arrival[j])
    return [candidates[j] for j in order[:k]]


def choose_as_generated(rng: random.Random, candidates: Sequence[int], copies: Sequence[int], k: int) -> list[int]:
    """K indices drawn uniformly from the samples as generated: index i stands for ``copies[i]`` samples.

    Without replacement from that multiset when it holds at least K samples (all of them, in random
    order, when it holds exactly K), i.i.d. in proportion to the copies otherwise."""
    generated = [i for i in candidates for _ in range(max(1, copies[i]))]
    if len(generated) >= k:
        return rng.sample(generated, k)
    return rng.choices(generated, k=k)


class Sampler:
    """Serves ``POST /v1/sample`` from the store."""

    def __init__(self, store: BufferStore, attempts: int = 5) -> None:
        self.store = store
        self.attempts = attempts

    async def sample(self, req: SampleRequest) -> dict[str, Any]:
        """A SampledBatch as a plain dict (ready to encode); raises NotEnoughPrompts / BufferChanging."""
        rng = random.Random(req.seed)
        for _ in range(self.attempts):
            batch = await self._attempt(req, rng)
            if batch is not None:
                return batch
        raise BufferChanging("the buffer changed under every attempt to draw this batch; retry")

    async def _attempt(self, req: SampleRequest, rng: random.Random) -> dict[str, Any] | None:
        branches = draw_branches(rng, req.num_prompts, req.recency_prob)
        picked = await self.store.pick_prompts(
            trainer_version=req.trainer_version, recent_versions=req.recent_versions,
            max_staleness=req.max_staleness, only_version=req.only_version, num_prompts=req.num_prompts,
            recency_slots=branches.count(RECENCY), uniforms=[rng.random() for _ in range(2 * req.num_prompts)])
        if isinstance(picked, int):
            raise NotEnoughPrompts(f"the buffer holds {picked} eligible prompts, fewer than "
                                   f"num_prompts={req.num_prompts}{_eligibility_note(req)}")
        # Recency slots beyond the recent prompts available fall back to the reward branch.
        plan = [RECENCY] * picked.recency_taken + [REWARD] * (req.num_prompts - picked.recency_taken)
        th = thresholds(req, picked.newest)
        chosen: list[tuple[PromptView, str, list[int]]] = []
        for view, branch in zip(picked.views, plan, strict=True):
            cand = th.eligible(view.versions, branch)
            if not cand:  # cannot happen with a consistent index; never answer with an empty group
                return None
            if th.exact is not None:
                branch = ON_POLICY
                idx = choose_as_generated(rng, cand, view.copies, req.samples_per_prompt)
            else:
                idx = choose_samples(rng, cand, view.rewards, req.samples_per_prompt, branch, req.reward_inv_temp)
            chosen.append((view, branch, idx))
        records = await self.store.records([(v.prompt_id, [v.sample_ids[i] for i in idx]) for v, _, idx in chosen],
                                           served=req.num_prompts * req.samples_per_prompt)
        groups = []
        for (view, branch, idx), recs in zip(chosen, records, strict=True):
            if any(r is None for r in recs):  # evicted between the pick and this read: draw again
                return None
            groups.append(_group(view, branch, idx, recs, req.trainer_version))
        return {"schema_version": SCHEMA_VERSION, "trainer_version": req.trainer_version, "groups": groups}


def _group(view: PromptView, branch: str, idx: list[int], recs: list[bytes], trainer_version: int) -> dict:
    samples = []
    for i, rec in zip(idx, recs, strict=True):
        ids, lp, ref_lp, finish = decode_record(rec)
        v = view.versions[i]
        samples.append({"completion_ids": ids, "reward": view.rewards[i], "logprob_sum": lp,
                        "ref_logprob_sum": ref_lp, "version": v, "staleness": trainer_version - v,
                        "finish_reason": finish})
    return {"prompt_id": view.prompt_id, "prompt_ids": view.prompt_ids, "prompt_text": view.prompt_text,
            "task": view.task, "branch": branch, "samples": samples}


def _eligibility_note(req: SampleRequest) -> str:
    if req.only_version is not None:
        return f" holding samples of version {req.only_version}"
    if req.max_staleness is not None:
        return f" with samples no older than version {req.trainer_version - req.max_staleness}"
    return ""
