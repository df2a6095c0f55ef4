"""Publishing scored groups to the trajectory stream, without ever losing one.

Groups go to Redis with one pipelined ``XADD`` per batch (field
:data:`tba.keys.STREAM_FIELD`, msgpack :class:`ScoredGroup`). When Redis is
unreachable they go to the on-disk :class:`SpillQueue` instead, and while that
queue is not empty every new group goes behind it, so the stream receives
groups in the order they were generated. Retries follow bounded exponential
backoff with full jitter (``tba.retry``) and never block generation: a retry
that is not due yet is simply skipped. A group that reaches Redis twice (a
crash between XADD and deleting its spill file) is harmless: the buffer stores
each ``group_id`` once.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass

import redis

from services.searcher.spill import SpillEntry, SpillQueue
from tba.codec import PayloadError, decode, encode, unpack
from tba.keys import STREAM_FIELD, Keys
from tba.retry import backoff_delays
from tba.schemas import ScoredGroup

log = logging.getLogger(__name__)


@dataclass
class PublishStats:
    groups_published: int = 0
    samples_published: int = 0
    groups_spilled_total: int = 0
    spill_bad_entries: int = 0
    redis_ok: bool = True
    last_error: str = ""


class Publisher:
    """XADD to ``Keys.trajectories``; spill, back off with jitter, replay in order."""

    def __init__(
        self,
        client: redis.Redis,
        keys: Keys,
        spill: SpillQueue,
        *,
        max_payload_bytes: int,
        chunk: int = 256,
        backoff_base: float = 0.2,
        backoff_cap: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
    ) -> None:
        self.client = client
        self.keys = keys
        self.spill = spill
        self.max_payload_bytes = max_payload_bytes
        self.chunk = chunk
        self.stats = PublishStats()
        self._backoff = (backoff_base, backoff_cap)
        self._rng = rng or random.Random()
        self._delays = backoff_delays(*self._backoff, rng=self._rng)
        self._clock = clock
        self._next_try = 0.0

    # --- public API ---
    def publish(self, groups: list[ScoredGroup]) -> None:
        """Send ``groups`` now if possible, else append them to the spill queue; then replay what is due."""
        payloads = [encode(g) for g in groups]
        if not len(self.spill) and self._due():
            try:
                self._xadd(payloads)
            except redis.RedisError as err:
                self._failed(err)
            else:
                self._succeeded(len(payloads), sum(len(g.samples) for g in groups))
                return
        for p in payloads:
            self.spill.put(p)
        self.stats.groups_spilled_total += len(payloads)
        log.info(
            "spilled %d groups to %s (queue: %d groups, %d bytes)",
            len(payloads),
            self.spill.dir,
            len(self.spill),
            self.spill.nbytes,
        )
        self.pump()

    def pump(self) -> None:
        """Replay spilled groups, oldest first, while Redis takes them and a retry is due."""
        while len(self.spill) and self._due():
            entries = self._valid(self.spill.peek(self.chunk))
            if not entries:
                continue
            try:
                self._xadd([e.payload for e in entries])
            except redis.RedisError as err:
                self._failed(err)
                return
            self.spill.remove(entries)
            self._succeeded(len(entries), sum(len(unpack(e.payload)["samples"]) for e in entries))
            if not len(self.spill):
                log.warning("spill queue drained: every spilled group is on the stream")

    def flush(self, timeout: float) -> bool:
        """Try for up to ``timeout`` seconds to empty the spill queue; True if it is empty.

        What is left stays on disk and is published by the next start."""
        deadline = self._clock() + timeout
        while True:
            self.pump()
            if not len(self.spill):
                return True
            now = self._clock()
            if now >= deadline:
                break
            time.sleep(min(max(self._next_try - now, 0.01), deadline - now))
        log.warning(
            "shutting down with %d groups in the spill queue %s; the next start publishes them",
            len(self.spill),
            self.spill.dir,
        )
        return False

    # --- internals ---
    def _due(self) -> bool:
        return self._clock() >= self._next_try

    def _xadd(self, payloads: list[bytes]) -> None:
        pipe = self.client.pipeline(transaction=False)
        for p in payloads:
            pipe.xadd(self.keys.trajectories, {STREAM_FIELD: p})
        pipe.execute()

    def _valid(self, entries: list[SpillEntry]) -> list[SpillEntry]:
        """Entries that still decode as ScoredGroup; others are quarantined, not published."""
        ok = []
        for e in entries:
            try:
                decode(e.payload, ScoredGroup, max_bytes=self.max_payload_bytes)
            except PayloadError as err:
                self.spill.quarantine(e, str(err))
                self.stats.spill_bad_entries += 1
            else:
                ok.append(e)
        return ok

    def _failed(self, err: redis.RedisError) -> None:
        delay = next(self._delays)
        self._next_try = self._clock() + delay
        self.stats.last_error = f"{type(err).__name__}: {err}"
        if self.stats.redis_ok:
            log.warning(
                "Redis unreachable (%s): spilling groups to %s, retrying with backoff",
                self.stats.last_error,
                self.spill.dir,
            )
        else:
            log.info("Redis still unreachable (%s); next retry in %.2f s", self.stats.last_error, delay)
        self.stats.redis_ok = False

    def _succeeded(self, groups: int, samples: int) -> None:
        if not self.stats.redis_ok:
            log.warning("Redis is reachable again; %d spilled groups left to replay", len(self.spill))
            self._delays = backoff_delays(*self._backoff, rng=self._rng)
        self.stats.redis_ok = True
        self.stats.groups_published += groups
        self.stats.samples_published += samples
