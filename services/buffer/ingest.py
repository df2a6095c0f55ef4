"""Getting scored groups in: the trajectory stream's consumer.

At-least-once delivery, exactly-once storage:

- entries are read with ``XREADGROUP`` in the consumer group ``Keys.ingest_group``;
  a batch is stored in two idempotent steps (:meth:`BufferStore.write_entries`: each
  group in its prompt's slot, then one global step that applies the changes *and acks
  the entries atomically*), so a crash leaves an entry either applied-and-acked or
  pending, and its replay finishes it without storing or counting anything twice;
- at start, and after any error, the consumer first re-reads its own pending
  entries (id ``0``); entries of a consumer that died are taken over with
  ``XAUTOCLAIM`` once idle for ``claim_idle_ms``;
- a group resent under a new entry (same ``group_id``) is stored once and counted
  as duplicate samples;
- an entry that cannot be decoded or validated goes to the dead-letter stream with
  the reason and is acknowledged (also atomically); one whose write keeps failing
  goes there after ``MAX_STORE_FAILURES`` attempts, so nothing crash-loops;
- the stream is trimmed only below the oldest entry still pending or undelivered,
  i.e. of acknowledged entries only.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from typing import Any

import msgpack
from redis.exceptions import (
    BusyLoadingError,
    ClusterDownError,
    MasterDownError,
    NoScriptError,
    OutOfMemoryError,
    ReadOnlyError,
    ResponseError,
    TryAgainError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from services.buffer.metrics import BufferMetrics
from services.buffer.store import BufferStore, StreamEntry, WriteResult
from tba.codec import PayloadError, decode, encode
from tba.keys import STREAM_FIELD
from tba.redis_client import AsyncRedis
from tba.retry import backoff_delays
from tba.schemas import ScoredGroup
from tba.settings import BufferSettings

log = logging.getLogger(__name__)

MAX_STORE_FAILURES = 5
_FIELD = STREAM_FIELD.encode()
_TRANSIENT_CLASSES = (
    RedisConnectionError,
    RedisTimeoutError,
    OutOfMemoryError,
    BusyLoadingError,
    ReadOnlyError,
    TryAgainError,
    ClusterDownError,
    MasterDownError,
    NoScriptError,
)
_TRANSIENT = {"OOM", "BUSY", "LOADING", "READONLY", "MASTERDOWN", "TRYAGAIN", "CLUSTERDOWN", "NOREPLICAS", "NOSCRIPT"}
Entry = tuple[bytes, dict[bytes, bytes] | None]


def is_transient(err: Exception) -> bool:
    """Errors that say nothing about the entry (Redis down, full, loading, failing over)."""
    if isinstance(err, _TRANSIENT_CLASSES):
        return True
    text = str(err)
    return isinstance(err, ResponseError) and (text.split(" ", 1)[0] in _TRANSIENT or "OOM command not allowed" in text)


def count_samples(payload: bytes | None) -> int:
    """Best-effort sample count of a payload that failed validation (for the counters)."""
    try:
        obj = msgpack.unpackb(payload or b"", raw=False)
    except Exception:  # noqa: BLE001 (anything undecodable counts as zero samples)
        return 0
    samples = obj.get("samples") if isinstance(obj, dict) else None
    return len(samples) if isinstance(samples, list) else 0


class Ingestor:
    def __init__(
        self, redis: AsyncRedis, store: BufferStore, settings: BufferSettings, metrics: BufferMetrics | None = None
    ) -> None:
        self.redis = redis
        self.store = store
        self.settings = settings
        self.metrics = metrics
        self.stream = store.keys.trajectories
        self.group = store.keys.ingest_group
        self.consumer = settings.consumer_name
        self.failures: dict[str, int] = {}
        self.backlog = True  # re-read own pending entries first
        self.last_claim = 0.0
        self.last_trim = 0.0
        self.healthy = False
        self.last_error: str | None = None

    async def ensure_group(self) -> None:
        try:
            await self.redis.xgroup_create(self.stream, self.group, id="0", mkstream=True)
        except ResponseError as err:
            if "BUSYGROUP" not in str(err):
                raise

    async def run(self, stop: asyncio.Event) -> None:
        """Consume until ``stop`` is set; transient Redis failures back off and retry, never crash."""
        delays = backoff_delays(base=0.2, cap=5.0)
        while not stop.is_set():
            try:
                await self.ensure_group()
                await self.store.load_scripts()  # again after a failure: Redis may have restarted empty
                while not stop.is_set():
                    await self.step()
                    delays = backoff_delays(base=0.2, cap=5.0)
            except Exception as err:  # noqa: BLE001 (the consumer must outlive any one failure)
                self.healthy, self.last_error = False, f"{type(err).__name__}: {err}"
                self.backlog = True
                delay = next(delays)
                if isinstance(err, RedisConnectionError | RedisTimeoutError | ResponseError | OSError):
                    log.warning("ingest: %s; retrying in %.1f s", self.last_error, delay)
                else:  # a bug, not the weather: say so loudly, keep consuming
                    log.exception("ingest: unexpected failure; retrying in %.1f s", delay)
                try:
                    await asyncio.wait_for(stop.wait(), delay)
                except TimeoutError:
                    pass

    async def step(self, block_ms: int | None = None) -> int:
        """Read and store one batch (own backlog first, then new entries); housekeeping when due."""
        n = self.settings.ingest_batch
        if self.backlog:
            entries = await self._read("0", n, None)
            if not entries:
                self.backlog = False
        else:
            entries = await self._read(">", n, self.settings.ingest_block_ms if block_ms is None else block_ms)
        handled = await self.process(entries)
        self.healthy, self.last_error = True, None
        now = time.monotonic()
        if now - self.last_claim >= self.settings.claim_idle_ms / 2000:
            self.last_claim = now
            handled += await self.claim()
            await self.store.recover(stale_seconds=self.settings.claim_idle_ms / 1000)
        if now - self.last_trim >= self.settings.trim_interval_seconds:
            self.last_trim = now
            await self.trim()
        return handled

    async def _read(self, from_id: str, count: int, block: int | None) -> list[Entry]:
        # RESP2 and RESP3 answer in different shapes
        out: Any = await self.redis.xreadgroup(
            self.group, self.consumer, {self.stream: from_id}, count=count, block=block
        )
        if not out:
            return []
        if isinstance(out, dict):  # RESP3
            return list(next(iter(out.values()))[0])
        return list(out[0][1])

    async def claim(self) -> int:
        """Take over entries a dead consumer read but never acknowledged."""
        handled, start = 0, "0-0"
        for _ in range(100):  # bounded: at most 100 batches per round
            nxt, entries, *_ = await self.redis.xautoclaim(
                self.stream,
                self.group,
                self.consumer,
                self.settings.claim_idle_ms,
                start_id=start,
                count=self.settings.ingest_batch,
            )
            if entries:
                log.info("ingest: reclaimed %d entries idle for %d ms", len(entries), self.settings.claim_idle_ms)
                handled += await self.process(entries)
            start = nxt.decode() if isinstance(nxt, bytes) else str(nxt)
            if start == "0-0":
                break
        return handled

    async def process(self, entries: Sequence[Entry]) -> int:
        """Store (or dead-letter) each entry; its ack is part of the same atomic global step."""
        if not entries:
            return 0
        groups: list[ScoredGroup] = []
        where: list[StreamEntry] = []
        letters: list[tuple[StreamEntry, str, bytes, int]] = []
        gone: list[str] = []
        for entry_id, fields in entries:
            eid = entry_id.decode() if isinstance(entry_id, bytes) else str(entry_id)
            loc = StreamEntry(self.stream, self.group, eid)
            if not fields:  # deleted from the stream while pending: nothing left to store
                gone.append(eid)
                continue
            payload = fields.get(_FIELD)
            try:
                if payload is None:
                    raise PayloadError(f"entry has no field {STREAM_FIELD!r} (fields: {sorted(fields)})")
                group = decode(payload, ScoredGroup, max_bytes=self.settings.max_payload_bytes)
            except PayloadError as err:
                letters.append((loc, str(err), payload or b"", count_samples(payload)))
                continue
            mismatch = await self.store.objective_mismatch(group.temperature, group.reference)
            if mismatch is not None:
                letters.append((loc, f"{mismatch} (searcher {group.searcher_id})", payload, len(group.samples)))
                continue
            groups.append(group)
            where.append(loc)
        if gone:
            await self.redis.xack(self.stream, self.group, *gone)
            self._observe("gone", [0] * len(gone))
        await self._dead_letter(letters)
        results = await self.store.write_entries(groups, where)
        await self._account(groups, where, results)
        return len(entries)

    async def _dead_letter(self, letters: list[tuple[StreamEntry, str, bytes, int]]) -> None:
        if not letters:
            return
        for loc, reason, _, _ in letters:
            log.warning("ingest: dead-lettering entry %s: %s", loc.entry_id, reason)
        for res in await self.store.dead_letter(letters):
            if isinstance(res, Exception):
                raise res  # nothing of this batch is lost: the entry is still pending
        self._observe("dead", [n for *_, n in letters])

    def _observe(self, kind: str, sizes: list[int]) -> None:
        if self.metrics is not None:
            for n in sizes:
                self.metrics.observe_ingest(kind, n, None)

    async def _account(
        self, groups: list[ScoredGroup], where: list[StreamEntry], results: list[WriteResult | Exception]
    ) -> None:
        """Metrics for stored groups; a group whose prompt step failed stays pending, and goes to the
        dead letters after ``MAX_STORE_FAILURES`` attempts."""
        letters = []
        for group, loc, res in zip(groups, where, results, strict=True):
            if isinstance(res, Exception):
                if is_transient(res):
                    raise res  # Redis is unwell, not the entry: back off, re-read the backlog later
                fails = self.failures.get(loc.entry_id, 0) + 1
                self.failures[loc.entry_id] = fails
                log.error("ingest: storing entry %s failed (%d/%d): %s", loc.entry_id, fails, MAX_STORE_FAILURES, res)
                self.backlog = True  # it stays pending: re-read it from our backlog
                if fails >= MAX_STORE_FAILURES:
                    letters.append((loc, f"store failed {fails} times: {res}", encode(group), len(group.samples)))
                continue
            self.failures.pop(loc.entry_id, None)
            if self.metrics is not None:
                self.metrics.observe_ingest("write", len(group.samples), res)
        await self._dead_letter(letters)

    async def trim(self) -> int:
        """Drop entries below the oldest one still pending or undelivered: acknowledged ones only."""
        groups = await self.redis.xinfo_groups(self.stream)
        ours = next((g for g in groups if _s(g["name"]) == self.group), None)
        if ours is None or len(groups) != 1:
            return 0  # another consumer group reads this stream too: its acks are not ours to judge
        last = _s(ours["last-delivered-id"])
        pending = await self.redis.xpending(self.stream, self.group)
        if pending["pending"]:
            minid = _s(pending["min"])
        else:
            ms, seq = last.split("-")
            minid = f"{ms}-{int(seq) + 1}"
        if minid == "0-1":
            return 0
        return int(await self.redis.xtrim(self.stream, minid=minid, approximate=False))


def _s(x: Any) -> str:
    return x.decode() if isinstance(x, bytes) else str(x)
