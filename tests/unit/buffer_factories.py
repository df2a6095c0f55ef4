"""Builders of buffer test data, shared by the buffer's unit and integration tests."""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Sequence

from tba.schemas import SampledBatch, SampleRequest, ScoredGroup, ScoredSample

_counter = itertools.count()
TEMPERATURE, REFERENCE = 0.7, "test-reference"  # the objective of every group made here


def make_sample(tokens: Sequence[int], reward: float = 0.0, logprob: float = -1.0) -> ScoredSample:
    return ScoredSample(
        completion_ids=list(tokens),
        completion_text="x" * len(tokens),
        reward=reward,
        logprob_sum=logprob,
        ref_logprob_sum=logprob - 0.5,
    )


def make_group(
    prompt_id: str = "p0",
    version: int = 0,
    rewards: Sequence[float] = (0.0, 1.0),
    tokens: Sequence[Sequence[int]] | None = None,
    searcher_id: str = "s0",
    group_id: str | None = None,
) -> ScoredGroup:
    """A group whose completions are distinct unless ``tokens`` says otherwise."""
    if tokens is None:
        tokens = [[next(_counter) % 50_000 + 1, i + 1] for i in range(len(rewards))]
    return ScoredGroup(
        group_id=group_id or uuid.uuid4().hex,
        prompt_id=prompt_id,
        prompt_text=f"prompt {prompt_id}",
        prompt_ids=[1, 2, 3],
        task="arithmetic",
        policy_version=version,
        searcher_id=searcher_id,
        temperature=TEMPERATURE,
        reference=REFERENCE,
        samples=[make_sample(t, r) for t, r in zip(tokens, rewards, strict=True)],
    )


async def served(sampler, request: SampleRequest) -> SampledBatch:
    """What the sampler serves for ``request``, validated against the strict schema as the trainer does."""
    return SampledBatch.model_validate(await sampler.sample(request))


def check_consistency(client, ns: str = "tba") -> dict:
    """Read every buffer key (a test may scan) and assert the indexes agree; return a summary."""
    from services.buffer.redis_scripts import VERSION_SHIFT
    from tba.keys import Keys

    keys = Keys(ns)
    g = keys.global_key("")
    newest = {k.decode(): int(v) for k, v in client.zrange(g + "newest_version", 0, -1, withscores=True)}
    oldest = {k.decode(): int(v) for k, v in client.zrange(g + "oldest_sample", 0, -1, withscores=True)}
    assert set(newest) == set(oldest), "newest_version and oldest_sample index different prompts"
    arrivals = {k.decode() for k in client.zrange(g + "arrivals", 0, -1)}
    assert arrivals == set(newest), "the arrival order and newest_version index different prompts"
    version_counts: dict[int, int] = {}
    total, reward_sum = 0, 0.0
    for p in newest:
        order = {h: int(s) for h, s in client.zrange(keys.prompt_key(p, "order"), 0, -1, withscores=True)}
        rewards = client.hgetall(keys.prompt_key(p, "rewards"))
        records = client.hgetall(keys.prompt_key(p, "records"))
        assert set(order) == set(rewards) == set(records), f"prompt {p}: order/rewards/records disagree"
        copies = {h: int(c) for h, c in client.hgetall(keys.prompt_key(p, "copies")).items()}
        assert set(copies) <= set(order) and all(c > 1 for c in copies.values()), f"prompt {p}: copies {copies}"
        assert order, f"prompt {p} is indexed but empty"
        versions = [s // VERSION_SHIFT for s in order.values()]
        assert newest[p] == max(versions), f"prompt {p}: newest_version {newest[p]} != {max(versions)}"
        assert oldest[p] == min(order.values()), f"prompt {p}: oldest_sample is not its oldest score"
        counted = {int(k): int(v) for k, v in client.hgetall(keys.prompt_key(p, "version_counts")).items()}
        expect = {v: versions.count(v) for v in set(versions)}
        assert counted == expect, f"prompt {p}: per-version counts {counted} != {expect}"
        for v in expect:
            assert client.zscore(g + f"version_prompts:{v}", p) is not None, f"prompt {p} missing from version {v}"
            version_counts[v] = version_counts.get(v, 0) + expect[v]
        assert client.exists(keys.prompt_key(p, "meta")), f"prompt {p} lost its record"
        total += len(order)
        reward_sum += sum(float(x) for x in rewards.values())
    stored_counts = {int(k): int(v) for k, v in client.hgetall(g + "version_counts").items()}
    assert stored_counts == version_counts
    stats = {k.decode(): v.decode() for k, v in client.hgetall(g + "stats").items()}
    assert int(stats.get("samples", 0)) == total
    assert abs(float(stats.get("reward_sum", 0)) - reward_sum) < 1e-6 * max(1.0, total)
    counters = {
        k: int(stats.get(k, 0))
        for k in ("samples_ingested", "samples_duplicate", "samples_evicted", "samples_dead_lettered")
    }
    assert counters["samples_ingested"] == (
        total + counters["samples_evicted"] + counters["samples_duplicate"] + counters["samples_dead_lettered"]
    ), (counters, total)
    return {"prompts": len(newest), "samples": total, "versions": version_counts, **counters}
