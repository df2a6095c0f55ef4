"""The sampling rule of docs/algorithm.md §4: recency with probability m, else reward.

For each of the P prompt slots independently, with probability m the **recency**
branch takes a prompt (without replacement) among those holding samples of the
newest versions, ``version >= newest_stored - recent_versions + 1``, and draws K
of those samples uniformly (when the request carries ``after_arrival``, the
trainer's cursor, it takes those prompts in the order their newest group arrived
after it instead, each arrival once: the answer's ``arrival_cursor`` is the next
request's); otherwise, or when no recent prompt is left, the
**reward** branch takes any eligible prompt (without replacement) and draws K of
its samples with probability softmax(inv_temp · reward). A prompt appears at most
once per batch. Samples are drawn without replacement when the prompt has at least
K candidates (for the reward branch, sequentially in proportion to the weights,
i.e. Plackett-Luce via Gumbel top-K, so the first draw is exactly the softmax),
i.i.d. with replacement otherwise. ``max_staleness`` drops samples older than
``trainer_version - max_staleness``. ``recency_draw="as_generated"`` draws the recency branch's K
samples as the on-policy draw below does.

A request that cannot be served yet (too few eligible prompts, or fewer generated samples than its
``min_samples_generated``) waits up to ``wait_seconds`` (a long-poll): each write of new samples
(:class:`services.buffer.store.Arrivals`) wakes it to try again.

``only_version`` (sync mode) is the on-policy draw instead: the batch's prompts are those
holding samples of that version, and each prompt's K samples are drawn uniformly, without
replacement, from the samples *as generated*: a completion generated c times at that version
counts c times (the store keeps each distinct completion once, with its copies). When K equals
the searchers' samples per prompt, a prompt's group is exactly what the policy generated.

A call reads Redis three times (:class:`Sampler`): ``pick_prompts.lua`` draws the prompts by rank
from sorted sets (O(log N) each) and computes the version cut-offs of both branches; ``read_prompt.lua``
reads each chosen prompt whole (at most the per-prompt capacity), pipelined; then one pipelined
``HMGET`` per prompt fetches the K chosen records, which :func:`services.buffer.records.served_group`
turns into the served groups. O(P log N + P · capacity + P · K), whatever the number of stored samples.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from services.buffer.records import PromptView, prompt_view, served_batch, served_group
from services.buffer.store import GENERATED_COUNTER, BufferStore
from tba.keys import SAMPLES_SERVED
from tba.schemas import SampleRequest

RECENCY, REWARD, ON_POLICY = "recency", "reward", "on_policy"


class NotEnoughPrompts(Exception):
    """Fewer eligible distinct prompts than asked: the caller should wait and retry (HTTP 409)."""


class NotEnoughGenerated(Exception):
    """The buffer has taken in fewer generated samples than ``min_samples_generated``: the trainer's reuse
    bound binds; the caller should wait and retry (HTTP 409)."""


class BufferChanging(Exception):
    """Concurrent writes kept invalidating the draw; retrying later will succeed (HTTP 503)."""


@dataclass(frozen=True)
class Thresholds:
    """Which samples each branch may use: version >= its cut-off, or == ``exact`` (``only_version``) when set.
    The cut-offs come from ``pick_prompts.lua``, which computes them from the newest version it sees stored."""

    recency_low: float
    reward_low: float
    exact: int | None

    def eligible(self, versions: Sequence[int], branch: str) -> list[int]:
        if self.exact is not None:
            return [i for i, v in enumerate(versions) if v == self.exact]
        low = self.recency_low if branch == RECENCY else self.reward_low
        return [i for i, v in enumerate(versions) if v >= low]


@dataclass(frozen=True)
class Picked:
    """The prompts drawn for a batch, the recency picks first, and the cut-offs their samples are held to."""

    recency_taken: int
    arrival_cursor: int | None  # the last arrival the recency branch looked at (after_arrival requests)
    thresholds: Thresholds
    views: list[PromptView]


def draw_branches(rng: random.Random, num_prompts: int, m: float) -> list[str]:
    """One independent Bernoulli(m) per slot: recency or reward."""
    return [RECENCY if rng.random() < m else REWARD for _ in range(num_prompts)]


def softmax(x: Sequence[float], inv_temp: float) -> list[float]:
    z = [inv_temp * r for r in x]
    top = max(z)
    w = [math.exp(v - top) for v in z]
    s = sum(w)
    return [v / s for v in w]


def choose_samples(
    rng: random.Random, candidates: Sequence[int], rewards: Sequence[float], k: int, branch: str, inv_temp: float
) -> list[int]:
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
    """Serves ``POST /v1/sample`` from the store: draws by the rule above, reads Redis as the module says."""

    def __init__(self, store: BufferStore, attempts: int = 5) -> None:
        self.store = store
        self.attempts = attempts

    async def sample(self, req: SampleRequest) -> dict[str, Any]:
        """A batch by the rule, in the wire form of a :class:`tba.schemas.SampledBatch`; raises
        NotEnoughPrompts / NotEnoughGenerated once ``req.wait_seconds`` (at most the buffer's
        ``max_sample_wait_seconds``) have passed without the batch becoming possible (a long-poll: each
        write of new samples wakes the request to try again), and BufferChanging."""
        deadline = time.monotonic() + min(req.wait_seconds, self.store.settings.max_sample_wait_seconds)
        while True:
            try:
                return await self.sample_now(req)
            except (NotEnoughPrompts, NotEnoughGenerated):
                left = deadline - time.monotonic()
                if left <= 0:
                    raise
                await self.store.arrivals.wait(left)

    async def sample_now(self, req: SampleRequest) -> dict[str, Any]:
        """One try of :meth:`sample`, without waiting."""
        if req.min_samples_generated is not None:
            generated = await self.store.samples_generated()
            if generated < req.min_samples_generated:
                raise NotEnoughGenerated(
                    f"the buffer has taken in {generated} generated samples, fewer than "
                    f"min_samples_generated={req.min_samples_generated} (the trainer's reuse bound)"
                )
        rng = random.Random(req.seed)
        for _ in range(self.attempts):
            batch = await self._attempt(req, rng)
            if batch is not None:
                return batch
        raise BufferChanging("the buffer changed under every attempt to draw this batch; retry")

    async def _attempt(self, req: SampleRequest, rng: random.Random) -> dict[str, Any] | None:
        branches = draw_branches(rng, req.num_prompts, req.recency_prob)
        picked = await self._pick(
            req, recency_slots=branches.count(RECENCY), uniforms=[rng.random() for _ in range(2 * req.num_prompts)]
        )
        # Recency slots beyond the recent prompts available fall back to the reward branch.
        plan = [RECENCY] * picked.recency_taken + [REWARD] * (req.num_prompts - picked.recency_taken)
        th = picked.thresholds
        chosen: list[tuple[PromptView, str, list[int]]] = []
        for view, branch in zip(picked.views, plan, strict=True):
            cand = th.eligible(view.versions, branch)
            if not cand:  # the prompt changed between the pick and its read; never answer with an empty group
                return None
            if th.exact is not None:
                branch = ON_POLICY
                idx = choose_as_generated(rng, cand, view.copies, req.samples_per_prompt)
            elif branch == RECENCY and req.recency_draw == "as_generated":
                idx = choose_as_generated(rng, cand, view.copies, req.samples_per_prompt)
            else:
                idx = choose_samples(rng, cand, view.rewards, req.samples_per_prompt, branch, req.reward_inv_temp)
            chosen.append((view, branch, idx))
        records, generated = await self._records(
            [(v.prompt_id, [v.sample_ids[i] for i in idx]) for v, _, idx in chosen],
            served=req.num_prompts * req.samples_per_prompt,
        )
        groups = []
        for (view, branch, idx), recs in zip(chosen, records, strict=True):
            present = [r for r in recs if r is not None]
            if len(present) < len(recs):  # evicted between the pick and this read: draw again
                return None
            groups.append(served_group(view, branch, idx, present, req.trainer_version))
        return served_batch(req.trainer_version, groups, generated, picked.arrival_cursor)

    async def _pick(self, req: SampleRequest, recency_slots: int, uniforms: list[float]) -> Picked:
        """Draw the batch's prompts from the global indexes, then read each one atomically; raises
        NotEnoughPrompts when fewer than ``num_prompts`` are eligible."""
        store = self.store
        args = [
            store.global_prefix,
            req.trainer_version,
            req.recent_versions,
            "" if req.max_staleness is None else req.max_staleness,
            "" if req.only_version is None else req.only_version,
            req.num_prompts,
            recency_slots,
            "" if req.after_arrival is None else req.after_arrival,
            *(repr(u) for u in uniforms),
        ]
        answer = await store.scripts.pick_prompts(keys=[store.keys.global_key("newest_version")], args=args)
        eligible, reward_low, *rest = answer
        if not rest:
            raise NotEnoughPrompts(
                f"the buffer holds {eligible} eligible prompts, fewer than "
                f"num_prompts={req.num_prompts}{_eligibility_note(req, float(reward_low))}"
            )
        recency_low, recency_taken, cursor, *prompts = rest
        prompts = [p.decode() for p in prompts]
        calls = [(store.prompt_script_keys(p), [store.keys.prompt_key(p, "")]) for p in prompts]
        read = await store.scripts.many(store.scripts.read_prompt, calls)
        for r in read:
            if isinstance(r, Exception):
                raise r
        return Picked(
            recency_taken=int(recency_taken),
            arrival_cursor=int(cursor) if cursor else None,
            thresholds=Thresholds(float(recency_low), float(reward_low), req.only_version),
            views=[prompt_view(p, r) for p, r in zip(prompts, read, strict=True)],
        )

    async def _records(
        self, wanted: list[tuple[str, list[bytes]]], served: int
    ) -> tuple[list[list[bytes | None]], int]:
        """The chosen samples' records (None where one was evicted meanwhile) and the generated samples taken
        in so far; the served counters counted; in one round trip."""
        store = self.store
        pipe = store.redis.pipeline(transaction=False)
        for prompt_id, sample_ids in wanted:
            pipe.hmget(store.keys.prompt_key(prompt_id, "records"), sample_ids)
        pipe.pfadd(store.served_distinct_key, *(f"{p}/{s.decode()}" for p, ids in wanted for s in ids))
        pipe.hincrby(store.stats_key, SAMPLES_SERVED, served)
        pipe.hincrby(store.stats_key, "sample_requests", 1)
        pipe.hget(store.stats_key, GENERATED_COUNTER)
        *records, _distinct, _served, _requests, generated = await pipe.execute()
        return records, int(generated or 0)


def _eligibility_note(req: SampleRequest, reward_low: float) -> str:
    if req.only_version is not None:
        return f" holding samples of version {req.only_version}"
    if reward_low > -math.inf:
        return f" with samples no older than version {reward_low:.0f}"
    return ""
