"""Chi-square tests of the sampling rule (docs/algorithm.md §4) on a real Redis.

Every draw is seeded (``SampleRequest.seed``), so each test is deterministic: it
either always passes or always fails. A threshold of p > 1e-3 accepts the rule;
each test also shows its power by rejecting a wrong rule on the same counts.
"""

from __future__ import annotations

import itertools
import math
from collections import Counter

import pytest
from scipy.stats import chisquare

from services.buffer.sampler import Sampler, softmax
from services.buffer.store import BufferStore
from tba.redis_client import async_client
from tba.schemas import SampleRequest
from tba.settings import BufferSettings
from tests.unit.buffer_factories import make_group, served

pytestmark = pytest.mark.anyio
ACCEPT = 1e-3


@pytest.fixture
async def sampler(redis_server):
    client = async_client(redis_server.url)
    yield Sampler(BufferStore(client, BufferSettings(redis_url=redis_server.url)))
    await client.aclose()


async def draw(sampler: Sampler, calls: int, **kw) -> list[dict]:
    groups = []
    for seed in range(calls):
        batch = await served(sampler, SampleRequest(seed=seed, **kw))
        groups += batch.model_dump()["groups"]
    return groups


def p_value(observed: Counter, expected_probs: dict) -> float:
    keys = list(expected_probs)
    n = sum(observed.values())
    assert set(observed) <= set(keys), f"drew outside the support: {set(observed) - set(keys)}"
    return chisquare([observed[k] for k in keys], [n * expected_probs[k] for k in keys]).pvalue


async def test_branch_frequencies_follow_m(sampler) -> None:
    """Each slot takes the recency branch with probability m (enough recent prompts: no fallback)."""
    for i in range(8):
        await sampler.store.write_group(make_group(f"p{i}", version=3 if i < 4 else 1, rewards=[0.0, 1.0]))
    m, P = 0.3, 3
    groups = await draw(sampler, 400, num_prompts=P, samples_per_prompt=2, trainer_version=3, recency_prob=m)
    counts = Counter(g["branch"] for g in groups)
    assert p_value(counts, {"recency": m, "reward": 1 - m}) > ACCEPT
    assert p_value(counts, {"recency": 0.4, "reward": 0.6}) < ACCEPT  # power: m = 0.4 is rejected
    for g in groups:  # recency groups are recent prompts with their newest samples
        if g["branch"] == "recency":
            assert {s["version"] for s in g["samples"]} == {3}


async def test_reward_branch_first_draw_is_softmax_of_rewards(sampler) -> None:
    """K=1 from 5 samples: the drawn sample follows softmax(inv_temp · reward)."""
    rewards = [0.0, 0.5, 1.0, 1.5, 2.0]
    for i in range(10):
        await sampler.store.write_group(make_group(f"p{i}", rewards=rewards, tokens=[[t] for t in range(1, 6)]))
    groups = await draw(
        sampler, 150, num_prompts=10, samples_per_prompt=1, trainer_version=0, recency_prob=0.0, reward_inv_temp=1.3
    )
    counts = Counter(g["samples"][0]["reward"] for g in groups)
    probs = dict(zip(rewards, softmax(rewards, 1.3), strict=True))
    assert p_value(counts, probs) > ACCEPT
    assert p_value(counts, dict.fromkeys(rewards, 0.2)) < ACCEPT  # power: uniform is rejected


async def test_reward_branch_without_replacement_is_sequential_softmax(sampler) -> None:
    """K=3 of 5 distinct samples: the drawn set has the Plackett-Luce (sequential softmax) law."""
    rewards = [0.0, 0.5, 1.0, 1.5, 2.0]
    for i in range(10):
        await sampler.store.write_group(make_group(f"p{i}", rewards=rewards, tokens=[[t] for t in range(1, 6)]))
    groups = await draw(
        sampler, 150, num_prompts=10, samples_per_prompt=3, trainer_version=0, recency_prob=0.0, reward_inv_temp=1.3
    )
    w = [math.exp(1.3 * r) for r in rewards]
    law: Counter = Counter()
    for perm in itertools.permutations(range(5), 3):  # probability of each ordered draw, summed per set
        p, left = 1.0, sum(w)
        for j in perm:
            p, left = p * w[j] / left, left - w[j]
        law[frozenset(rewards[j] for j in perm)] += p
    sets = Counter(frozenset(s["reward"] for s in g["samples"]) for g in groups)
    assert all(len({s["reward"] for s in g["samples"]}) == 3 for g in groups)  # no repeats when n >= K
    assert p_value(sets, law) > ACCEPT
    naive = {k: 1 / len(law) for k in law}
    assert p_value(sets, naive) < ACCEPT


async def test_recency_branch_draws_uniformly_among_the_newest_samples(sampler) -> None:
    """R=2: only versions >= newest-1 are drawn, uniformly, with replacement when fewer than K."""
    for i in range(6):
        g = f"p{i}"
        await sampler.store.write_group(make_group(g, version=5, rewards=[5.0, 5.1, 5.2]))
        await sampler.store.write_group(make_group(g, version=4, rewards=[4.0, 4.1]))
        await sampler.store.write_group(make_group(g, version=2, rewards=[2.0, 2.1, 2.2, 2.3]))
    groups = await draw(
        sampler,
        100,
        num_prompts=6,
        samples_per_prompt=8,
        trainer_version=5,
        recency_prob=1.0,
        recent_versions=2,
        reward_inv_temp=5.0,
    )
    assert all(g["branch"] == "recency" for g in groups)
    counts = Counter(s["reward"] for g in groups for s in g["samples"])
    newest = [5.0, 5.1, 5.2, 4.0, 4.1]
    assert p_value(counts, dict.fromkeys(newest, 1 / 5)) > ACCEPT


async def test_prompts_are_drawn_uniformly_without_replacement(sampler) -> None:
    for i in range(7):
        await sampler.store.write_group(make_group(f"p{i}", version=i % 2, rewards=[0.0, 1.0]))
    groups = await draw(sampler, 400, num_prompts=3, samples_per_prompt=1, trainer_version=1, recency_prob=0.0)
    calls = [groups[i : i + 3] for i in range(0, len(groups), 3)]
    assert all(len({g["prompt_id"] for g in c}) == 3 for c in calls)
    counts = Counter(g["prompt_id"] for g in groups)
    assert p_value(counts, {f"p{i}": 1 / 7 for i in range(7)}) > ACCEPT
    recent = await draw(sampler, 300, num_prompts=1, samples_per_prompt=1, trainer_version=1, recency_prob=1.0)
    counts = Counter(g["prompt_id"] for g in recent)  # recency: uniform among p1, p3, p5 (version 1)
    assert p_value(counts, {p: 1 / 3 for p in ("p1", "p3", "p5")}) > ACCEPT


async def arrival_draw(sampler: Sampler, after: int, num_prompts: int = 2, **kw) -> tuple[list[tuple[str, str]], int]:
    """One batch drawn in arrival order after ``after``: its (prompt, branch) pairs and its cursor."""
    kw = {"samples_per_prompt": 2, "trainer_version": 5, "recency_prob": 1.0, "seed": after, **kw}
    batch = await served(sampler, SampleRequest(num_prompts=num_prompts, after_arrival=after, **kw))
    assert batch.arrival_cursor is not None
    return [(g.prompt_id, g.branch) for g in batch.groups], batch.arrival_cursor


async def test_arrival_order_serves_each_new_group_once_oldest_first(sampler) -> None:
    """With the trainer's cursor, the recency branch takes the groups in the order they arrived, each once;
    with nothing new it falls back to the reward branch; a prompt whose new group arrives comes again."""
    for i in range(6):
        await sampler.store.write_group(make_group(f"p{i}", version=5))
    served_order, cursor = [], 0
    for _ in range(3):
        groups, cursor = await arrival_draw(sampler, cursor)
        assert {branch for _, branch in groups} == {"recency"}
        served_order += [prompt for prompt, _ in groups]
    assert served_order == [f"p{i}" for i in range(6)] and cursor == 6
    groups, again = await arrival_draw(sampler, cursor)
    assert again == 6 and {branch for _, branch in groups} == {"reward"}  # nothing new: replay
    await sampler.store.write_group(make_group("p1", version=5))
    groups, cursor = await arrival_draw(sampler, cursor)
    assert groups[0] == ("p1", "recency") and groups[1][1] == "reward" and cursor == 7
    # Without a cursor the branch draws among the newest versions' prompts: no cursor comes back.
    batch = await served(sampler, SampleRequest(num_prompts=2, samples_per_prompt=2, trainer_version=5, seed=0))
    assert batch.arrival_cursor is None


async def test_arrival_order_passes_over_groups_outside_the_recency_window(sampler) -> None:
    """Arrivals holding no sample of the newest recent_versions versions (within max_staleness) are looked
    at once and never served by the recency branch: the cursor moves past them, and the samples of those
    served are all within the window. What is left of the batch comes from the reward branch."""
    for i, version in enumerate([1, 5, 1, 4, 5]):
        await sampler.store.write_group(make_group(f"p{i}", version=version))
    request = {"num_prompts": 3, "samples_per_prompt": 2, "trainer_version": 6, "recency_prob": 1.0}
    wide = await served(sampler, SampleRequest(**request, recent_versions=2, max_staleness=2, after_arrival=0))
    assert [(g.prompt_id, g.branch) for g in wide.groups] == [("p1", "recency"), ("p3", "recency"), ("p4", "recency")]
    assert wide.arrival_cursor == 5 and all(s.version >= 4 for g in wide.groups for s in g.samples)
    narrow = await served(sampler, SampleRequest(**request, recent_versions=1, max_staleness=2, after_arrival=0))
    assert [(g.prompt_id, g.branch) for g in narrow.groups][:2] == [("p1", "recency"), ("p4", "recency")]
    assert narrow.groups[2].branch == "reward" and narrow.groups[2].prompt_id == "p3"  # v1 is beyond the bound
    assert narrow.arrival_cursor == 5


async def test_a_cursor_beyond_every_arrival_starts_again_from_the_first(sampler) -> None:
    """A cursor past the buffer's arrivals (its Redis started afresh, the trainer's cursor did not) is read
    as the start: the new arrivals are served, not skipped for ever."""
    for i in range(3):
        await sampler.store.write_group(make_group(f"p{i}", version=5))
    groups, cursor = await arrival_draw(sampler, 1_000)
    assert groups == [("p0", "recency"), ("p1", "recency")] and cursor == 2
