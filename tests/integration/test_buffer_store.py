"""Buffer storage and sampling against a real redis-server: writes, dedup, eviction, the sampling rule."""

from __future__ import annotations

import asyncio
import math
import time
import uuid

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from services.buffer.records import sample_id
from services.buffer.redis_scripts import VERSION_SHIFT
from services.buffer.sampler import NotEnoughGenerated, NotEnoughPrompts, Sampler
from services.buffer.store import BufferStore, group_intent
from tba.keys import Keys
from tba.redis_client import async_client
from tba.schemas import SampleRequest
from tba.settings import BufferSettings
from tests.unit.buffer_factories import check_consistency, make_group, served

pytestmark = pytest.mark.anyio


@pytest.fixture
async def make_store(redis_server):
    clients = []

    async def make(**overrides) -> BufferStore:
        client = async_client(redis_server.url)
        clients.append(client)
        return BufferStore(client, BufferSettings(redis_url=redis_server.url, **overrides))

    yield make
    for c in clients:
        await c.aclose()


def req(**kw) -> SampleRequest:
    base = {"num_prompts": 1, "samples_per_prompt": 2, "trainer_version": 0, "recency_prob": 0.0, "seed": 0}
    return SampleRequest(**{**base, **kw})


async def test_round_trip_returns_stored_samples_exactly(make_store, redis_server) -> None:
    store = await make_store()
    groups = [make_group(f"p{i}", version=i, rewards=[0.1 * i, 0.5, 1.0]) for i in range(4)]
    for g in groups:
        res = await store.write_group(g)
        assert (res.added, res.duplicates, res.evicted, res.resent) == (3, 0, 0, False)
    batch = await served(Sampler(store), req(num_prompts=4, samples_per_prompt=3, trainer_version=5, recency_prob=0.5))
    assert sorted(g.prompt_id for g in batch.groups) == ["p0", "p1", "p2", "p3"]
    by_id = {g.prompt_id: g for g in groups}
    for got in batch.groups:
        sent = by_id[got.prompt_id]
        assert got.prompt_ids == sent.prompt_ids and got.prompt_text == sent.prompt_text and got.task == sent.task
        assert len(got.samples) == 3
        sent_by_tokens = {tuple(s.completion_ids): s for s in sent.samples}
        assert {tuple(s.completion_ids) for s in got.samples} == set(sent_by_tokens)  # K = n: no repeats
        for s in got.samples:
            src = sent_by_tokens[tuple(s.completion_ids)]
            assert (s.reward, s.logprob_sum, s.ref_logprob_sum) == (src.reward, src.logprob_sum, src.ref_logprob_sum)
            assert s.version == sent.policy_version and s.staleness == 5 - sent.policy_version
    stats = await store.stats()
    assert stats["samples_served"] == 12 and stats["sample_requests"] == 1
    assert stats["versions"] == {0: 3, 1: 3, 2: 3, 3: 3}
    check_consistency(redis_server.client())


async def test_distinct_samples_served_count_each_sample_once(make_store) -> None:
    """samples_served counts draws; samples_served_distinct counts the stored samples drawn at least once, against
    samples_stored_total, the distinct samples stored over the run (a resent group adds none)."""
    store = await make_store()
    groups = [make_group(f"p{i}", version=10, rewards=[0.0, 0.5, 1.0]) for i in range(2)]
    for g in [*groups, groups[0]]:  # the first group resent: three duplicates
        await store.write_group(g)
    await store.write_group(make_group("stale", version=0, rewards=[1.0, 1.0]))  # older than the bound allows
    sampler = Sampler(store)
    stats = await store.stats()
    assert stats["samples_served_distinct"] == 0 and stats["samples_stored_total"] == 8
    for seed in range(3):  # K = 3 = the samples each prompt holds: every draw serves all six
        await served(sampler, req(num_prompts=2, samples_per_prompt=3, trainer_version=10, max_staleness=0, seed=seed))
    stats = await store.stats()
    assert stats["samples_served"] == 18
    assert stats["samples_served_distinct"] == 6
    assert stats["samples_stored_total"] == 8 and stats["samples_duplicate"] == 3


async def test_same_group_twice_is_stored_once(make_store, redis_server) -> None:
    store = await make_store()
    g = make_group("p", rewards=[1.0, 2.0, 3.0])
    await store.write_group(g)
    again = await store.write_group(g)
    assert again.resent and again.added == 0 and again.duplicates == 3
    stats = await store.stats()
    assert stats["samples"] == 3 and stats["samples_ingested"] == 6 and stats["samples_duplicate"] == 3
    assert stats["groups_ingested"] == 2 and stats["groups_stored"] == 1 and stats["groups_duplicate"] == 1
    assert stats["reward_mean"] == pytest.approx(2.0)
    check_consistency(redis_server.client())


async def test_duplicate_completion_keeps_the_newest_copy(make_store, redis_server) -> None:
    store = await make_store()
    same = [[7, 7, 7]]
    await store.write_group(make_group("p", version=1, rewards=[0.0], tokens=same))
    res = await store.write_group(make_group("p", version=3, rewards=[1.0], tokens=same))
    assert (res.added, res.duplicates) == (0, 1)
    late = await store.write_group(make_group("p", version=2, rewards=[5.0], tokens=same))  # older copy arrives late
    assert (late.added, late.duplicates) == (0, 1)
    stats = await store.stats()
    assert stats["samples"] == 1 and stats["versions"] == {3: 1} and stats["reward_mean"] == 1.0
    assert stats["samples_duplicate"] == 2
    batch = await served(Sampler(store), req(samples_per_prompt=1, trainer_version=3))
    assert batch.groups[0].samples[0].version == 3
    check_consistency(redis_server.client())


async def test_per_prompt_capacity_evicts_oldest_version_first(make_store, redis_server) -> None:
    store = await make_store(per_prompt_capacity=5)
    await store.write_group(make_group("p", version=3, rewards=[3.0, 3.1, 3.2]))
    await store.write_group(make_group("p", version=1, rewards=[1.0, 1.1, 1.2]))
    res = await store.write_group(make_group("p", version=2, rewards=[2.0, 2.1, 2.2]))
    assert res.evicted == 3  # the second write already evicted one version-1 sample
    stats = await store.stats()
    assert stats["versions"] == {2: 2, 3: 3} and stats["samples_evicted"] == 4
    rewards = sorted(
        s.reward for s in (await served(Sampler(store), req(samples_per_prompt=5, trainer_version=3))).groups[0].samples
    )
    assert rewards == [2.1, 2.2, 3.0, 3.1, 3.2]  # within version 2, the earliest arrival went first
    check_consistency(redis_server.client())


async def test_global_capacity_evicts_oldest_first_across_prompts(make_store, redis_server) -> None:
    store = await make_store(global_capacity=10)
    for name, version in (("a", 0), ("b", 1), ("c", 2)):
        await store.write_group(make_group(name, version=version, rewards=[0.0] * 4))
    stats = await store.stats()
    assert stats["samples"] == 10 and stats["versions"] == {0: 2, 1: 4, 2: 4}
    await store.write_group(make_group("d", version=0, rewards=[0.0] * 4))  # as old as a's: a goes first
    stats = await store.stats()
    assert stats["samples"] == 10 and stats["prompts"] == 3  # a emptied and dropped
    assert stats["versions"] == {0: 2, 1: 4, 2: 4} and stats["samples_evicted"] == 6
    summary = check_consistency(redis_server.client())
    assert summary["prompts"] == 3


class ModelBuffer:
    """The storage rules in plain Python, as the oracle: dedup by tokens (newest version kept), then
    per-prompt capacity, then global capacity, both evicting the lowest (version, arrival) first."""

    def __init__(self, pcap: int, gcap: int) -> None:
        self.pcap, self.gcap = pcap, gcap
        self.seq = 0
        self.groups: set[str] = set()
        self.prompts: dict[str, dict[str, tuple[int, int, float]]] = {}

    def write(self, group) -> None:
        if group.group_id in self.groups:
            return
        self.groups.add(group.group_id)
        store = self.prompts.setdefault(group.prompt_id, {})
        for s in group.samples:
            self.seq += 1
            h = sample_id(s.completion_ids)
            if h not in store or group.policy_version >= store[h][0]:
                store[h] = (group.policy_version, self.seq, s.reward)
        while len(store) > self.pcap:
            del store[min(store, key=lambda h: store[h][:2])]
        while sum(map(len, self.prompts.values())) > self.gcap:
            p, h = min(
                ((p, h) for p, hs in self.prompts.items() for h in hs), key=lambda ph: self.prompts[ph[0]][ph[1]][:2]
            )
            del self.prompts[p][h]
        self.prompts = {p: hs for p, hs in self.prompts.items() if hs}


def stored_state(sync) -> dict[str, dict[str, tuple[int, int, float]]]:
    from tba.keys import Keys

    k, out = Keys(), {}
    for p in (x.decode() for x in sync.zrange(k.global_key("newest_version"), 0, -1)):
        rewards = sync.hgetall(k.prompt_key(p, "rewards"))
        out[p] = {
            h.decode(): (int(sc) // VERSION_SHIFT, int(sc) % VERSION_SHIFT, float(rewards[h]))
            for h, sc in sync.zrange(k.prompt_key(p, "order"), 0, -1, withscores=True)
        }
    return out


def arrival_ranks(state: dict[str, dict[str, tuple[int, int, float]]]) -> dict[str, dict[str, tuple]]:
    """The state with arrival numbers replaced by their rank: numbers a resend reserved leave gaps,
    the order is what the rules depend on."""
    seqs = sorted(seq for hs in state.values() for _, seq, _ in hs.values())
    rank = {seq: i for i, seq in enumerate(seqs)}
    return {p: {h: (v, rank[seq], r) for h, (v, seq, r) in hs.items()} for p, hs in state.items()}


_op = st.tuples(
    st.sampled_from(["a", "b", "c"]),  # prompt
    st.integers(0, 4),  # version
    st.lists(st.integers(1, 6), min_size=1, max_size=5),  # completion tokens (collide often, also in a group)
    st.booleans(),  # resend the previous group
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=st.lists(_op, min_size=1, max_size=12), pcap=st.integers(1, 4), gcap=st.integers(1, 8))
def test_any_write_sequence_matches_the_model_and_keeps_counters_exact(redis_server, ops, pcap, gcap) -> None:
    """Dedup, resends and both capacities in any order: the stored samples are exactly the model's,
    every index agrees, and the counters add up."""
    sync = redis_server.client()
    sync.flushdb()
    model = ModelBuffer(pcap, gcap)

    async def run() -> None:
        client = async_client(redis_server.url)
        store = BufferStore(
            client, BufferSettings(redis_url=redis_server.url, per_prompt_capacity=pcap, global_capacity=gcap)
        )
        previous = None
        for prompt, version, toks, resend in ops:
            group = (
                previous
                if resend and previous
                else make_group(
                    prompt, version, rewards=[float(t) + version / 10 for t in toks], tokens=[[t] for t in toks]
                )
            )
            await store.write_group(group)
            model.write(group)
            previous = group
        await client.aclose()

    asyncio.run(run())
    assert arrival_ranks(stored_state(sync)) == arrival_ranks(model.prompts)
    check_consistency(sync)


async def test_not_enough_prompts_is_reported_not_padded(make_store) -> None:
    store = await make_store()
    await store.write_group(make_group("only"))
    with pytest.raises(NotEnoughPrompts, match="1 eligible prompts, fewer than num_prompts=2"):
        await served(Sampler(store), req(num_prompts=2))
    with pytest.raises(NotEnoughPrompts):
        await served(Sampler(store), req(num_prompts=1, only_version=7))


async def test_only_version_and_max_staleness_filter_samples(make_store) -> None:
    store = await make_store()
    for i in range(3):
        await store.write_group(make_group(f"p{i}", version=1, rewards=[0.0, 0.0]))
        await store.write_group(make_group(f"p{i}", version=4, rewards=[1.0, 1.0]))
    await store.write_group(make_group("old", version=0, rewards=[0.0, 0.0]))
    sampler = Sampler(store)
    for seed in range(10):
        batch = await served(sampler, req(num_prompts=3, samples_per_prompt=4, only_version=1, seed=seed))
        assert {s.version for g in batch.groups for s in g.samples} == {1}
        batch = await served(
            sampler,
            req(num_prompts=3, samples_per_prompt=4, trainer_version=6, max_staleness=2, recency_prob=0.5, seed=seed),
        )
        assert {s.version for g in batch.groups for s in g.samples} == {4}
        assert all(s.staleness == 2 for g in batch.groups for s in g.samples)
    with pytest.raises(NotEnoughPrompts, match="no older than version 5"):
        await served(sampler, req(trainer_version=7, max_staleness=2))


async def test_the_pick_computes_both_branches_cut_offs_from_the_newest_stored_version(make_store) -> None:
    store = await make_store()
    await store.write_group(make_group("new", version=9, rewards=[0.0]))
    await store.write_group(make_group("old", version=6, rewards=[0.0]))
    sampler = Sampler(store)

    async def cut_offs(**kw) -> tuple[float, float]:
        picked = await sampler._pick(req(**kw), recency_slots=0, uniforms=[0.5, 0.5])
        return picked.thresholds.recency_low, picked.thresholds.reward_low

    assert await cut_offs(trainer_version=10, recent_versions=2, max_staleness=3) == (8, 7)
    assert await cut_offs(trainer_version=20, recent_versions=2, max_staleness=11) == (9, 9)  # staleness wins
    assert await cut_offs(trainer_version=10, recent_versions=2) == (8, -math.inf)
    assert await cut_offs(trainer_version=10, only_version=6) == (6, 6)


async def test_duplicates_are_counted_per_version_for_the_on_policy_draw(make_store, redis_server) -> None:
    """A completion's copies count at its stored version only: repeats in a group and across groups of that
    version add up, an older version's copy adds nothing, a newer version starts the count again."""
    store = await make_store()
    a, b, c = [7, 7], [8, 8], [9, 9]
    await store.write_group(make_group("p", version=3, rewards=[1.0] * 4, tokens=[a, a, a, b]))
    await store.write_group(make_group("p", version=3, rewards=[1.0] * 2, tokens=[a, c]))
    await store.write_group(make_group("p", version=2, rewards=[1.0] * 2, tokens=[a, b]))

    async def generated_at(version: int, k: int) -> list[list[int]]:
        batch = await served(Sampler(store), req(samples_per_prompt=k, only_version=version, seed=1))
        assert {g.branch for g in batch.groups} == {"on_policy"}
        return sorted(s.completion_ids for s in batch.groups[0].samples)

    sync = redis_server.client()
    copies = Keys("tba").prompt_key("p", "copies")
    assert sync.hgetall(copies) == {sample_id(a).encode(): b"4"}
    assert await generated_at(3, 6) == sorted([a] * 4 + [b, c])  # K = all generated: exactly the generated samples
    await store.write_group(make_group("p", version=4, rewards=[1.0], tokens=[a]))
    await store.write_group(make_group("p", version=4, rewards=[1.0], tokens=[b]))
    assert await generated_at(3, 6) == [c] * 6  # with replacement from the one sample left at version 3
    assert await generated_at(4, 2) == sorted([a, b])
    assert sync.hgetall(copies) == {}  # one copy each: nothing recorded
    check_consistency(sync)


async def test_recency_takes_the_newest_versions_and_falls_back_to_reward(make_store) -> None:
    store = await make_store()
    await store.write_group(make_group("new", version=5, rewards=[1.0] * 3))
    await store.write_group(make_group("new", version=2, rewards=[0.0] * 3))
    await store.write_group(make_group("mid", version=4, rewards=[0.0] * 3))
    for i in range(4):
        await store.write_group(make_group(f"old{i}", version=1, rewards=[0.0] * 3))
    sampler = Sampler(store)
    for seed in range(20):
        batch = await served(sampler, req(num_prompts=3, samples_per_prompt=6, recency_prob=1.0, seed=seed))
        branches = {g.prompt_id: g.branch for g in batch.groups}
        assert branches.pop("new") == "recency" and set(branches.values()) == {"reward"}  # only one recent prompt
        new = next(g for g in batch.groups if g.prompt_id == "new")
        assert {s.version for s in new.samples} == {5}  # newest samples only, with replacement (3 < 6)
        batch = await served(
            sampler, req(num_prompts=2, samples_per_prompt=2, recency_prob=1.0, recent_versions=2, seed=seed)
        )
        assert sorted(g.prompt_id for g in batch.groups) == ["mid", "new"]
        assert all(g.branch == "recency" for g in batch.groups)


async def test_seeded_draws_are_reproducible(make_store) -> None:
    store = await make_store()
    for i in range(6):
        await store.write_group(make_group(f"p{i}", version=i % 3, rewards=[0.0, 1.0, 2.0, 3.0]))
    sampler = Sampler(store)
    r = req(num_prompts=3, samples_per_prompt=2, recency_prob=0.5, reward_inv_temp=1.0, seed=42)
    assert await served(sampler, r) == await served(sampler, r)


async def test_sampling_while_writers_evict_always_answers_whole_batches(make_store, redis_server) -> None:
    """Writers keep evicting (tiny capacities) while batches are drawn: every batch is complete and valid."""
    store = await make_store(per_prompt_capacity=3, global_capacity=30)
    for i in range(12):
        await store.write_group(make_group(f"p{i}", version=0, rewards=[0.0, 1.0, 2.0]))
    sampler = Sampler(store)
    done = asyncio.Event()

    async def writer() -> None:
        for n in range(300):
            await store.write_group(make_group(f"p{n % 12}", version=1 + n // 12, rewards=[0.5, 1.5]))
        done.set()

    async def reader() -> int:
        batches = 0
        while not done.is_set():
            batch = await served(
                sampler, req(num_prompts=4, samples_per_prompt=5, trainer_version=30, recency_prob=0.5, seed=None)
            )
            assert len(batch.groups) == 4 and all(len(g.samples) == 5 for g in batch.groups)
            batches += 1
        return batches

    _, batches = await asyncio.gather(writer(), reader())
    assert batches > 0
    check_consistency(redis_server.client())


async def test_http_writes_interrupted_between_steps_are_recovered(make_store, redis_server) -> None:
    """An HTTP write leaves an intent first: if its writer dies after the prompt step, the recovery
    sweep applies the recorded delta; if it died before, the sweep abandons the attempt, and a
    retry of the same group stores it afresh."""
    store = await make_store()
    sync = redis_server.client()
    done, lost = make_group("p", version=1, rewards=[1.0, 2.0]), make_group("q", version=1, rewards=[3.0])
    for group, reached_prompt in ((done, True), (lost, False)):
        intent = group_intent(group, at=time.time() - 60)
        first_arrival = await store.scripts.record_intent(
            keys=[store.intents_key], args=[store.global_prefix, uuid.uuid4().hex, intent, 2]
        )
        if reached_prompt:
            await store.scripts.prompt_step(
                keys=store.prompt_script_keys(group.prompt_id),
                args=store._write_args(group, first_arrival, time.time()),
            )
    assert (await store.stats())["samples"] == 0
    assert await store.recover(stale_seconds=30) == 2
    stats = await store.stats()
    assert stats["samples"] == 2 and stats["groups_stored"] == 1 and sync.hlen(store.intents_key) == 0
    check_consistency(sync)
    assert (await store.write_group(done)).resent  # the recovered write counts as stored
    again = await store.write_group(lost)  # the abandoned one is written now, once
    assert again.added == 1 and not again.resent
    stats = await store.stats()
    assert stats["samples"] == 3 and stats["groups_stored"] == 2 and stats["groups_duplicate"] == 1
    check_consistency(sync)


async def test_an_interrupted_global_eviction_is_finished_by_recovery(make_store, redis_server) -> None:
    store = await make_store(global_capacity=4)
    sync = redis_server.client()
    for name, version in (("a", 0), ("b", 1)):
        await store.write_group(make_group(name, version=version, rewards=[0.0] * 3))
    assert (await store.stats())["samples"] == 4
    store.settings.global_capacity = 2  # shrunk: the next check plans an eviction; its writer dies there
    plan = await store.scripts.plan_eviction(
        keys=[store.stats_key], args=[store.global_prefix, 2, "tok", repr(time.time() - 60)]
    )
    assert plan[0] == b"a" and int(plan[1]) == 2
    assert await store.enforce_capacity() == 0  # the excess is reserved by the pending intent: no double eviction
    assert await store.recover(stale_seconds=30) == 1  # a's last sample: the plan stops at b's oldest
    assert (await store.stats())["samples"] == 3
    assert await store.enforce_capacity() == 1
    stats = await store.stats()
    assert stats["samples"] == 2 and stats["samples_evicted"] == 4 and stats["versions"] == {1: 2}
    assert sync.hget(store.stats_key, "evict_reserved") == b"0"
    check_consistency(sync)


async def test_a_waiting_request_is_served_when_the_samples_it_needs_arrive(make_store) -> None:
    """Long-poll: an on-policy request for a version not generated yet waits, and the write of that version
    wakes it; it is served that version's samples, never anything else."""
    store = await make_store()
    await store.write_group(make_group("p0", version=0))
    sampler = Sampler(store)
    waiting = asyncio.create_task(served(sampler, req(only_version=1, wait_seconds=30.0)))
    await asyncio.sleep(0.3)
    assert not waiting.done(), "answered before version 1 existed"
    notified = store.arrivals.notified
    await store.write_group(make_group("p1", version=1))
    batch = await asyncio.wait_for(waiting, 10)
    assert store.arrivals.notified == notified + 1
    assert [g.prompt_id for g in batch.groups] == ["p1"] and {s.version for s in batch.groups[0].samples} == {1}


async def test_a_request_that_cannot_be_served_answers_after_its_wait(make_store) -> None:
    store = await make_store()
    started = time.monotonic()
    with pytest.raises(NotEnoughPrompts):
        await Sampler(store).sample(req(only_version=3, wait_seconds=0.2))
    assert time.monotonic() - started >= 0.2


async def test_the_reuse_bound_holds_a_request_until_enough_samples_were_generated(make_store) -> None:
    """min_samples_generated counts every generated sample taken in, duplicates included; every batch says
    how many there were when it was drawn."""
    store = await make_store()
    await store.write_group(make_group("p0", rewards=[0.0, 1.0, 1.0]))  # 3 generated
    sampler = Sampler(store)
    batch = await served(sampler, req())
    assert batch.samples_generated == 3
    with pytest.raises(NotEnoughGenerated, match="fewer than min_samples_generated=5"):
        await sampler.sample(req(min_samples_generated=5))
    waiting = asyncio.create_task(served(sampler, req(min_samples_generated=5, wait_seconds=30.0)))
    await asyncio.sleep(0.2)
    assert not waiting.done()
    dup = make_group("p0", tokens=[s.completion_ids for s in (await served(sampler, req())).groups[0].samples])
    await store.write_group(dup)  # 2 duplicates: stored once each, generated twice
    batch = await asyncio.wait_for(waiting, 10)
    assert batch.samples_generated == 5 and (await store.stats())["samples"] == 3


async def test_the_recency_branch_draws_as_generated_when_asked(make_store) -> None:
    """A completion generated three times counts three times: K=4 from [a, a, a, b] is exactly that multiset,
    where the distinct draw sees two completions."""
    store = await make_store()
    await store.write_group(make_group("p0", rewards=[1.0, 1.0, 1.0, 0.0], tokens=[[7, 7], [7, 7], [7, 7], [9]]))
    sampler = Sampler(store)
    for seed in range(5):
        batch = await served(
            sampler, req(samples_per_prompt=4, recency_prob=1.0, recency_draw="as_generated", seed=seed)
        )
        group = batch.groups[0]
        assert group.branch == "recency"
        assert sorted(tuple(s.completion_ids) for s in group.samples) == [(7, 7), (7, 7), (7, 7), (9,)]
    draws = [
        tuple(s.completion_ids)
        for seed in range(40)
        for s in (await served(sampler, req(samples_per_prompt=4, recency_prob=1.0, seed=seed))).groups[0].samples
    ]
    assert 0.35 < draws.count((9,)) / len(draws) < 0.65  # distinct: each of the two half the time


async def test_a_multi_turn_trajectory_keeps_its_environment_spans(make_store, redis_server) -> None:
    """The same tokens as a single-turn completion and as a two-turn trajectory (the environment wrote two
    of them) are two samples; each is served with its own spans."""
    store = await make_store()
    g = make_group("p", version=1, rewards=[1.0, 0.0], tokens=[[7, 8, 9, 10], [7, 8, 9, 10]])
    g.samples[0].env_spans = [[1, 3]]
    res = await store.write_group(g)
    assert (res.added, res.duplicates) == (2, 0)
    batch = await served(Sampler(store), req(samples_per_prompt=2, trainer_version=1))
    spans = sorted((s.env_spans or [], s.reward) for s in batch.groups[0].samples)
    assert spans == [([], 0.0), ([[1, 3]], 1.0)]
    check_consistency(redis_server.client())
