"""Stream ingest against a real redis-server: ack after store, dead letters, reclaim, trim, AOF restart."""

from __future__ import annotations

import asyncio
import math
import time

import msgpack
import pytest

from services.buffer.ingest import MAX_STORE_FAILURES, Ingestor
from services.buffer.sampler import Sampler
from services.buffer.store import BufferStore
from tba.codec import encode, pack
from tba.keys import STREAM_FIELD, Keys
from tba.redis_client import async_client
from tba.schemas import SampleRequest
from tba.settings import BufferSettings
from tests.unit.buffer_factories import check_consistency, make_group, served

pytestmark = pytest.mark.anyio
K = Keys()


@pytest.fixture
async def make_ingestor(redis_server):
    clients = []

    async def make(**overrides) -> Ingestor:
        client = async_client(redis_server.url)
        clients.append(client)
        s = BufferSettings(**{"redis_url": redis_server.url, "consumer_name": "c1", "ingest_block_ms": 10, **overrides})
        ing = Ingestor(client, BufferStore(client, s), s)
        await ing.ensure_group()
        return ing

    yield make
    for c in clients:
        await c.aclose()


async def drain(ing: Ingestor) -> int:
    total, idle = 0, 0
    while idle < 2:
        n = await ing.step(block_ms=10)
        total += n
        idle = idle + 1 if n == 0 else 0
    return total


def xadd_groups(sync, groups) -> list[bytes]:
    return [sync.xadd(K.trajectories, {STREAM_FIELD: encode(g)}) for g in groups]


async def test_stream_groups_are_stored_acked_and_trimmed(make_ingestor, redis_server) -> None:
    ing = await make_ingestor(trim_interval_seconds=0.01)
    sync = redis_server.client()
    groups = [make_group(f"p{i % 5}", version=i % 3, rewards=[0.5, 1.5]) for i in range(40)]
    xadd_groups(sync, groups)
    assert await drain(ing) == 40
    assert sync.xpending(K.trajectories, K.ingest_group)["pending"] == 0
    await ing.trim()
    assert sync.xlen(K.trajectories) == 0  # every entry acked, so every entry trimmed
    stats = await ing.store.stats()
    assert stats["samples"] == 80 and stats["groups_stored"] == 40 and stats["prompts"] == 5
    assert stats["searcher_versions"] == {"s0": [0, 1, 2]}
    check_consistency(sync)


async def test_resent_and_redelivered_groups_are_stored_once(make_ingestor, redis_server) -> None:
    ing = await make_ingestor()
    sync = redis_server.client()
    g = make_group("p", rewards=[1.0, 2.0, 3.0])
    xadd_groups(sync, [g, g, g])  # a searcher that resent after a timeout, twice
    await drain(ing)
    stats = await ing.store.stats()
    assert stats["samples"] == 3 and stats["samples_duplicate"] == 6 and stats["samples_ingested"] == 9
    assert stats["searcher_samples"] == {"s0": 3}  # stored once, counted once
    check_consistency(sync)


async def test_each_searcher_is_credited_with_the_samples_it_added_and_they_are_served_with_its_id(
    make_ingestor, redis_server
) -> None:
    ing = await make_ingestor()
    sync = redis_server.client()
    first = make_group("p", rewards=[1.0, 0.0], tokens=[[7, 8], [9, 10]], searcher_id="s-a")
    # s-b generates one completion s-a already stored (a duplicate: counted as s-a's, served as the newest copy,
    # s-b's, whose log-prob it carries) and one new one.
    second = make_group("p", rewards=[1.0, 0.5], tokens=[[7, 8], [11, 12]], searcher_id="s-b|odd")
    xadd_groups(sync, [first, second])
    await drain(ing)
    stats = await ing.store.stats()
    assert stats["samples"] == 3 and stats["searcher_samples"] == {"s-a": 2, "s-b|odd": 1}
    batch = await served(Sampler(ing.store), SampleRequest(num_prompts=1, samples_per_prompt=8, trainer_version=0))
    expected = {(7, 8): "s-b|odd", (9, 10): "s-a", (11, 12): "s-b|odd"}
    got = {tuple(s.completion_ids): s.searcher_id for g in batch.groups for s in g.samples}
    assert got and all(expected[tokens] == searcher for tokens, searcher in got.items()), got


async def test_bad_entries_are_dead_lettered_with_reason_and_never_block(make_ingestor, redis_server) -> None:
    ing = await make_ingestor()
    sync = redis_server.client()
    good = make_group("good", rewards=[1.0])
    bad_schema = good.model_dump()
    bad_schema["samples"] = [dict(bad_schema["samples"][0], reward=math.nan)] * 2
    bad_schema["group_id"] = "bad"
    future = dict(make_group("future", rewards=[0.0]).model_dump(), policy_version=2**21)
    sync.xadd(K.trajectories, {STREAM_FIELD: b"\xc1 not msgpack"})
    sync.xadd(K.trajectories, {"wrong-field": b"x"})
    sync.xadd(K.trajectories, {STREAM_FIELD: pack(bad_schema)})
    sync.xadd(K.trajectories, {STREAM_FIELD: pack(future)})
    sync.xadd(K.trajectories, {STREAM_FIELD: b"x" * (ing.settings.max_payload_bytes + 1)})
    xadd_groups(sync, [good])
    await drain(ing)
    letters = sync.xrange(K.dead_letters)
    reasons = [f[b"reason"].decode() for _, f in letters]
    assert len(reasons) == 5
    assert "not valid msgpack" in reasons[0]
    assert "no field 'g'" in reasons[1]
    assert "samples.0.reward" in reasons[2] and "finite" in reasons[2]
    assert "policy_version" in reasons[3] and "less than or equal to 2097151" in reasons[3]
    assert "over the limit" in reasons[4]
    assert len(letters[4][1][b"payload"]) == ing.settings.dead_letter_payload_bytes  # truncated copy kept
    assert sync.xpending(K.trajectories, K.ingest_group)["pending"] == 0
    stats = await ing.store.stats()
    assert stats["dead_letters"] == 5 and stats["samples_dead_lettered"] == 3  # 2 (bad schema) + 1 (future)
    assert stats["samples"] == 1 and stats["prompts"] == 1  # nothing partial from the bad ones
    check_consistency(sync)


async def test_a_dead_consumers_entries_are_reclaimed_once(make_ingestor, redis_server) -> None:
    """A consumer reads entries and dies before storing them: another takes them over, nothing lost or doubled."""
    sync = redis_server.client()
    patient = await make_ingestor(claim_idle_ms=60_000)
    groups = [make_group(f"p{i}", rewards=[float(i)]) for i in range(30)]
    xadd_groups(sync, groups)
    read = sync.xreadgroup(K.ingest_group, "doomed", {K.trajectories: ">"}, count=20)  # read, never acked
    assert len(read[0][1]) == 20
    await drain(patient)  # takes the 10 unread ones; the doomed consumer's are not idle long enough
    assert (await patient.store.stats())["samples"] == 10
    assert sync.xpending(K.trajectories, K.ingest_group)["pending"] == 20
    await asyncio.sleep(0.15)
    ing = await make_ingestor(claim_idle_ms=100)
    await drain(ing)
    stats = await ing.store.stats()
    assert stats["samples"] == 30 and stats["samples_duplicate"] == 0
    assert sync.xpending(K.trajectories, K.ingest_group)["pending"] == 0
    check_consistency(sync)


async def test_a_slow_consumers_late_writes_count_nothing(make_ingestor, redis_server) -> None:
    """Entries reclaimed from a consumer that was slow, not dead: its late writes change no counter."""
    sync = redis_server.client()
    slow = await make_ingestor(consumer_name="slow")
    xadd_groups(sync, [make_group(f"p{i}", rewards=[1.0, 2.0]) for i in range(5)])
    sync.xadd(K.trajectories, {STREAM_FIELD: b"junk"})
    held = await slow._read(">", 10, None)
    await asyncio.sleep(0.15)
    await drain(await make_ingestor(consumer_name="fast", claim_idle_ms=100))
    before = await slow.store.stats()
    assert before["groups_ingested"] == 6 and before["samples"] == 10 and before["dead_letters"] == 1
    await slow.process(held)  # the slow consumer finally gets to its copies
    after = await slow.store.stats()
    assert after == before
    assert sync.xlen(K.dead_letters) == 1
    check_consistency(sync)


async def test_trim_keeps_pending_and_undelivered_entries(make_ingestor, redis_server) -> None:
    sync = redis_server.client()
    ing = await make_ingestor(claim_idle_ms=60_000)
    ids = xadd_groups(sync, [make_group(f"p{i}") for i in range(10)])
    sync.xreadgroup(K.ingest_group, "slow", {K.trajectories: ">"}, count=3)  # entries 0-2 pending elsewhere
    await drain(ing)
    await ing.trim()
    assert [e for e, _ in sync.xrange(K.trajectories)] == ids  # the oldest pending entry pins the stream
    sync.xack(K.trajectories, K.ingest_group, *ids[:3])
    later = xadd_groups(sync, [make_group("late")])  # added, not yet delivered
    await ing.trim()
    assert [e for e, _ in sync.xrange(K.trajectories)] == later


async def test_entries_failing_to_store_repeatedly_are_dead_lettered(make_ingestor, redis_server) -> None:
    """A write the store keeps refusing (here: a key of the wrong type) must not loop forever."""
    sync = redis_server.client()
    ing = await make_ingestor()
    sync.set(K.prompt_key("cursed", "order"), "not a sorted set")
    xadd_groups(sync, [make_group("cursed"), make_group("fine")])
    for _ in range(MAX_STORE_FAILURES + 2):
        await ing.step(block_ms=10)
    letters = sync.xrange(K.dead_letters)
    assert len(letters) == 1 and b"store failed" in letters[0][1][b"reason"]
    assert sync.xpending(K.trajectories, K.ingest_group)["pending"] == 0
    assert (await ing.store.stats())["prompts"] == 1


async def test_restarted_redis_with_aof_still_holds_the_buffer(make_ingestor, redis_server) -> None:
    ing = await make_ingestor()
    sync = redis_server.client()
    xadd_groups(sync, [make_group(f"p{i}", version=i % 4, rewards=[0.0, 1.0, 2.0]) for i in range(12)])
    await drain(ing)
    before = await ing.store.stats()
    redis_server.stop(kill=True)  # SIGKILL: only what reached the AOF survives
    redis_server.start()
    sync = redis_server.client()
    assert sync.config_get("appendonly")["appendonly"] == "yes"
    after = await ing.store.stats()  # same client: reconnects; scripts reload on NOSCRIPT
    assert after == before and after["samples"] == 36
    check_consistency(sync)
    batch = await served(Sampler(ing.store), SampleRequest(num_prompts=4, samples_per_prompt=3, trainer_version=3))
    assert len(batch.groups) == 4
    xadd_groups(sync, [make_group("after-restart", rewards=[1.0])])
    await drain(ing)
    assert (await ing.store.stats())["samples"] == 37


def test_count_samples_of_undecodable_payloads() -> None:
    from services.buffer.ingest import count_samples

    assert count_samples(msgpack.packb({"samples": [1, 2, 3]})) == 3
    assert count_samples(b"\xc1") == 0 and count_samples(None) == 0 and count_samples(msgpack.packb([1])) == 0


async def test_a_consumer_dying_between_the_prompt_and_global_steps_is_finished_by_replay(
    make_ingestor, redis_server
) -> None:
    """The prompt step ran for some groups, the global step (apply + ack) never did: whoever takes the
    entries over applies the recorded deltas once, storing and counting nothing twice."""
    sync = redis_server.client()
    groups = [make_group(f"p{i % 4}", version=i % 2, rewards=[0.0, 1.0, 2.0]) for i in range(12)]
    xadd_groups(sync, groups)
    dying = await make_ingestor(consumer_name="dying")
    held = await dying._read(">", 12, None)
    store = dying.store
    for group in groups[:7]:  # the prompt steps the dying consumer got through
        await store.scripts.prompt_step(
            keys=store.prompt_script_keys(group.prompt_id), args=store._write_args(group, 1000, time.time())
        )
    assert len(held) == 12 and (await store.stats())["samples"] == 0  # nothing applied globally yet
    await asyncio.sleep(0.15)
    await drain(await make_ingestor(consumer_name="heir", claim_idle_ms=100))
    stats = await store.stats()
    assert stats["groups_stored"] == 12 and stats["samples"] == 36
    assert stats["groups_duplicate"] == 0 and stats["samples_duplicate"] == 0
    assert sync.xpending(K.trajectories, K.ingest_group)["pending"] == 0
    check_consistency(sync)
