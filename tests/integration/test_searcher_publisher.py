"""The searcher's publisher against a real redis-server: stream round trip, spill while Redis is down,
replay in order when it is back and after a restart, backoff, corrupt spill entries."""

from __future__ import annotations

import random
from pathlib import Path

from services.searcher.publisher import Publisher
from services.searcher.spill import SpillQueue
from tba.codec import decode
from tba.keys import STREAM_FIELD, Keys
from tba.redis_client import sync_client
from tba.schemas import ScoredGroup, ScoredSample

KEYS = Keys("t")


def group(i: int, samples: int = 2) -> ScoredGroup:
    return ScoredGroup(
        prompt_id=f"p{i}",
        prompt_text=f"{i}+1=",
        prompt_ids=[1, 5, 6],
        task="arithmetic",
        policy_version=i % 3,
        searcher_id="s0",
        temperature=0.7,
        reference="r0",
        samples=[
            ScoredSample(
                completion_ids=[7, 2],
                completion_text="5",
                reward=float(j % 2),
                logprob_sum=-1.5,
                ref_logprob_sum=-2.0,
                finish_reason="stop",
            )
            for j in range(samples)
        ],
    )


def stream(redis_server) -> list[ScoredGroup]:
    entries = redis_server.client().xrange(KEYS.trajectories)
    return [decode(fields[STREAM_FIELD.encode()], ScoredGroup) for _id, fields in entries]


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def publisher(redis_server, spill_dir: Path, clock=None, **kwargs) -> Publisher:
    if clock:
        kwargs["clock"] = clock
    return Publisher(
        sync_client(redis_server.url, timeout=0.5, retry=False),
        KEYS,
        SpillQueue(spill_dir, 1 << 20),
        max_payload_bytes=1 << 20,
        **kwargs,
    )


def test_round_trip(redis_server, tmp_path: Path) -> None:
    pub = publisher(redis_server, tmp_path)
    sent = [group(i) for i in range(3)]
    pub.publish(sent)
    assert stream(redis_server) == sent
    assert pub.stats.groups_published == 3 and pub.stats.samples_published == 6
    assert len(pub.spill) == 0


def test_spill_while_down_then_replay_in_order(redis_server, tmp_path: Path) -> None:
    clock = Clock()
    pub = publisher(redis_server, tmp_path, clock)
    sent = [group(i) for i in range(10)]
    pub.publish(sent[:2])
    redis_server.stop(kill=True)
    pub.publish(sent[2:4])  # fails: spilled, and a retry is scheduled
    assert not pub.stats.redis_ok and len(pub.spill) == 2
    assert len(list(tmp_path.glob("*.msgpack"))) == 2
    clock.t += 60  # retries are due again, Redis still down
    pub.publish(sent[4:6])
    assert len(pub.spill) == 4 and pub.stats.groups_spilled_total == 4
    redis_server.start()  # same port, same AOF: the first two groups are still there
    pub.publish(sent[6:8])  # not due yet (backoff): goes behind the backlog, nothing reordered
    assert len(pub.spill) == 6
    clock.t += 60
    pub.publish(sent[8:])
    assert len(pub.spill) == 0 and pub.stats.redis_ok
    assert [g.group_id for g in stream(redis_server)] == [g.group_id for g in sent]
    assert pub.stats.groups_published == 10 and pub.stats.samples_published == 20
    assert not list(tmp_path.glob("*.msgpack"))


def test_restart_publishes_what_was_spilled(redis_server, tmp_path: Path) -> None:
    sent = [group(i) for i in range(4)]
    redis_server.stop(kill=True)
    pub = publisher(redis_server, tmp_path)
    pub.publish(sent)
    assert not pub.flush(timeout=0.3)  # Redis still down: flush gives up, the groups stay on disk
    pub.spill.close()  # the process ends
    redis_server.start()
    pub2 = publisher(redis_server, tmp_path)
    assert len(pub2.spill) == 4
    assert pub2.flush(timeout=5)
    assert [g.group_id for g in stream(redis_server)] == [g.group_id for g in sent]


def test_corrupt_spill_entry_is_quarantined(redis_server, tmp_path: Path) -> None:
    redis_server.stop(kill=True)
    pub = publisher(redis_server, tmp_path)
    sent = [group(i) for i in range(3)]
    pub.publish(sent)
    pub.spill.close()
    victim = sorted(tmp_path.glob("*.msgpack"))[1]
    victim.write_bytes(b"\xc1 not msgpack")
    redis_server.start()
    pub2 = publisher(redis_server, tmp_path)
    assert pub2.flush(timeout=5)
    assert [g.group_id for g in stream(redis_server)] == [sent[0].group_id, sent[2].group_id]
    assert (tmp_path / "bad" / victim.name).exists() and pub2.stats.spill_bad_entries == 1


def test_backoff_grows_with_jitter(redis_server, tmp_path: Path) -> None:
    """While Redis is away, each retry waits uniformly up to base * 2^attempt (capped): the waits grow, and differ."""
    clock = Clock()
    pub = publisher(redis_server, tmp_path, clock, backoff_base=1.0, backoff_cap=100.0, rng=random.Random(7))
    redis_server.stop(kill=True)
    waits = []
    for i in range(12):
        pub.publish([group(i)])
        waits.append(pub._next_try - clock.t)
        clock.t = pub._next_try
    assert all(0 <= w <= min(100.0, 2**k) for k, w in enumerate(waits))
    assert max(waits[:4]) <= 8.0 < max(waits[8:]), waits  # the bound grows from 1 s to the cap
    assert sum(waits[8:]) > 4 * sum(waits[:4]), waits
    assert len(set(waits)) == len(waits)  # jittered, not a fixed schedule
    assert len(pub.spill) == 12
