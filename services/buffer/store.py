"""Redis storage of the replay buffer: two-step atomic writes, recovery, global capacity, dead letters, figures.

Every change goes through the Lua scripts of :mod:`services.buffer.redis_scripts`, each confined to
one hash slot, so the same code runs on one Redis and on Redis Cluster (``TBA_REDIS_CLUSTER``).
A write is two steps, each atomic and each idempotent:

1. the *prompt step* (``prompt_step.lua``, in the prompt's slot) stores the group's samples in its
   prompt (dedup, per-prompt capacity) and records what it changed, the *delta*, under the group id;
   run again for the same group id it changes nothing and returns the recorded delta (not fresh);
2. the *global step* (``global_step.lua``, one call per ingest batch) applies the deltas to the global
   indexes and counters, registers each group id with the *token* of its attempt (the stream entry id,
   or an intent id), and acks the stream entries, all at once. A fresh delta is always applied; a
   recorded one only if its group id is not yet registered.

A crash between the steps leaves the delta recorded but not applied: a stream entry stays pending
and its replay applies it; an HTTP write, and every global eviction, first records an *intent* that
:meth:`BufferStore.recover` finishes. The prompt step remembers group ids for ``dedup_window_seconds``
and the global step a margin longer, so a replay the prompt recognises is always one the global step
can judge. The service keeps no state of its own; any number of replicas can share one Redis or one
Redis Cluster. The keys are listed in docs/architecture.md §3; sampling reads them in
:mod:`services.buffer.sampler`.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from dataclasses import dataclass
from typing import Any

import msgpack
from redis.asyncio.cluster import RedisCluster

from services.buffer.records import encode_record, sample_id
from services.buffer.redis_scripts import GLOBAL_ITEM_FIELDS, Scripts
from tba.codec import pack
from tba.keys import SAMPLES_TAKEN_IN, Keys
from tba.redis_client import AsyncRedis
from tba.schemas import ScoredGroup
from tba.settings import BufferSettings

STAT_COUNTERS = (
    "samples_ingested",
    "samples_duplicate",
    "samples_evicted",
    "samples_dead_lettered",
    "groups_ingested",
    "groups_duplicate",
    "groups_arrived",
    "dead_letters",
    "samples_served",
    "sample_requests",
)
# Every generated sample taken in, duplicates included: what the trainer's reuse bound counts against.
GENERATED_COUNTER = SAMPLES_TAKEN_IN
# A HyperLogLog of every stored sample served at least once (prompt and sample id): the distinct samples trained
# on, to set against the distinct samples stored, in 12 KB whatever the run's length (standard error 0.81%).
SERVED_DISTINCT = "served_distinct"
# Per-item answers of the global step (global_step.lua).
APPLIED, RESENT, NOTHING_TO_DO = 0, 1, 2
# Evictions planned per capacity check at most (each empties at least one prompt's oldest samples).
MAX_EVICTION_ROUNDS = 1000


@dataclass(frozen=True)
class WriteResult:
    """What one group write did, in samples."""

    added: int
    duplicates: int
    evicted: int
    resent: bool


@dataclass(frozen=True)
class StreamEntry:
    """Where a group came from, so its ack is part of the write."""

    stream: str
    group: str
    entry_id: str


@dataclass(frozen=True)
class _Item:
    """One change on its way to the global step: a group (``kind='group'``) or a global eviction
    (``'eviction'``), with the delta its prompt step returned."""

    kind: str
    group_id: str
    token: str
    entry_id: str
    prompt_id: str
    samples: int
    label: str
    delta: bytes
    fresh: bool

    def args(self) -> list[Any]:
        """This item's part of global_step.lua's ARGV, field by field in GLOBAL_ITEM_FIELDS' order."""
        return [_lua_arg(getattr(self, field)) for field in GLOBAL_ITEM_FIELDS]


def _lua_arg(value: Any) -> Any:
    return ("1" if value else "0") if isinstance(value, bool) else value


def _counts(delta: bytes) -> tuple[int, int, int]:
    """Samples added, duplicates, evicted, of a prompt step's delta."""
    d = msgpack.unpackb(delta, raw=False)
    return int(d["added"]), int(d["duplicates"]), int(d["evicted"])


def _label(group: ScoredGroup) -> str:
    """The group's searcher and policy version, as ``G searchers`` keeps them."""
    return f"{group.searcher_id}|{group.policy_version}"


def group_intent(group: ScoredGroup, at: float) -> bytes:
    """The intent recorded before an HTTP write, for :meth:`BufferStore.recover`."""
    return pack(
        {
            "kind": "group",
            "prompt": group.prompt_id,
            "group_id": group.group_id,
            "samples": len(group.samples),
            "label": _label(group),
            "at": at,
        }
    )


class Arrivals:
    """Wakes the sample requests that wait (long-poll) as soon as a write of this process stores samples.

    Only this process's writes notify: a request also looks again every :data:`RECHECK_SECONDS` at most,
    for samples that another buffer replica stored."""

    RECHECK_SECONDS = 0.05

    def __init__(self) -> None:
        self._event = asyncio.Event()
        self.notified = 0

    def notify(self) -> None:
        self.notified += 1
        self._event.set()
        self._event = asyncio.Event()  # the next waiters wait for the next write

    async def wait(self, timeout: float) -> None:
        """Until the next write or ``min(timeout, RECHECK_SECONDS)``, whichever comes first."""
        event = self._event
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(event.wait(), min(timeout, self.RECHECK_SECONDS))


class BufferStore:
    """The buffer's writes and figures, over one client of a Redis or a Redis Cluster (the module tells how)."""

    def __init__(self, redis: AsyncRedis, settings: BufferSettings) -> None:
        self.redis = redis
        self.settings = settings
        self.keys = Keys(settings.namespace)
        self.scripts = Scripts(redis)
        self.global_prefix = self.keys.global_key("")
        self.stats_key = self.keys.stats
        self.served_distinct_key = self.keys.global_key(SERVED_DISTINCT)
        self.intents_key = self.keys.global_key("intents")
        self.arrivals = Arrivals()
        self._objective: tuple[float, str] | None = None

    @property
    def prompt_window(self) -> float:
        return self.settings.dedup_window_seconds

    @property
    def global_window(self) -> float:
        """A margin longer than the prompts' (clock skew between replicas): a replay a prompt
        still recognises is always one the global step still knows."""
        w = self.settings.dedup_window_seconds
        return w + max(60.0, w / 10)

    async def load_scripts(self) -> None:
        """Load every script on every node (pipelines then need no NOSCRIPT round trip)."""
        await self.scripts.load()

    def prompt_script_keys(self, prompt_id: str) -> list[str]:
        """KEYS of a prompt's scripts: its meta key, which routes the call to the prompt's slot."""
        return [self.keys.prompt_key(prompt_id, "meta")]

    async def objective_mismatch(self, temperature: float | None, reference: str | None) -> str | None:
        """Why samples of this objective (temperature, reference model) do not belong here, or None.

        The first group or trainer that states an objective pins it for the namespace; every later one must
        match, or a searcher sampling at another temperature (or scoring against another reference) would
        change the loss the trainer computes without anyone noticing. Once read, the pin is kept in memory.
        A caller that states only one half is checked on that half, and pins nothing."""
        if self._objective is None:
            if temperature is None or reference is None:
                return None
            t, r = await self.scripts.pin_objective(
                keys=[self.keys.objective], args=[repr(float(temperature)), reference]
            )
            self._objective = (float(t), r.decode() if isinstance(r, bytes) else str(r))
        pinned_t, pinned_r = self._objective
        if temperature in (None, pinned_t) and reference in (None, pinned_r):
            return None
        stated = "unstated" if temperature is None else f"{temperature:g}"
        return (
            f"objective mismatch: temperature {stated} and reference model {reference}, but this "
            f"buffer's run (namespace {self.settings.namespace!r}) samples at temperature {pinned_t:g} and scores "
            f"against reference model {pinned_r}: configure TBA_TEMPERATURE and TBA_MODEL alike everywhere, "
            f"or start the new objective in a new TBA_NAMESPACE"
        )

    # --- writes ---
    def _write_args(self, group: ScoredGroup, first_arrival: int, now: float) -> list[Any]:
        """ARGV of the prompt step's 'write' (the group already passed validation)."""
        args: list[Any] = [
            self.keys.prompt_key(group.prompt_id, ""),
            "write",
            group.group_id,
            repr(now),
            repr(self.prompt_window),
            self.settings.per_prompt_capacity,
            pack(group.prompt_ids),
            group.prompt_text,
            group.task,
            group.policy_version,
            first_arrival,
            len(group.samples),
        ]
        for sample in group.samples:
            args += [
                sample_id(sample.completion_ids, sample.env_spans),
                repr(float(sample.reward)),
                encode_record(sample, group.searcher_id),
            ]
        return args

    async def _global_step(self, items: list[_Item], entry: StreamEntry | None, now: float) -> list[int]:
        """The global step for a batch: returns the samples stored, then one answer per item."""
        args: list[Any] = [
            self.global_prefix,
            repr(now),
            repr(self.global_window),
            entry.stream if entry else "",
            entry.group if entry else "",
            len(items),
        ]
        for item in items:
            args += item.args()
        return [int(x) for x in await self.scripts.global_step(keys=[self.stats_key], args=args)]

    async def write_group(self, group: ScoredGroup) -> WriteResult:
        """Store one group that did not come from the stream (HTTP): intent, prompt step, global step,
        then the global capacity. Idempotent by group id."""
        n, now, token = len(group.samples), time.time(), uuid.uuid4().hex
        first_arrival = await self.scripts.record_intent(
            keys=[self.intents_key], args=[self.global_prefix, token, group_intent(group, now), n]
        )
        delta, fresh = await self.scripts.prompt_step(
            keys=self.prompt_script_keys(group.prompt_id), args=self._write_args(group, first_arrival, now)
        )
        item = _Item("group", group.group_id, token, "", group.prompt_id, n, _label(group), delta, fresh == 1)
        total, answer = await self._global_step([item], None, now)
        self.arrivals.notify()
        evicted = await self.enforce_capacity(total)
        return self._result(answer, n, delta, evicted)

    async def write_entries(self, groups: list[ScoredGroup], where: list[StreamEntry]) -> list[WriteResult | Exception]:
        """Store groups read from the stream (each passed validation) and ack their entries: one prompt
        step per group (pipelined), one global step for the batch. An exception in the list is that
        group's prompt-step failure (the entry stays pending); a failure of the global step raises."""
        if not groups:
            return []
        now = time.time()
        total_n = sum(len(g.samples) for g in groups)
        arrival = await self.redis.incrby(self.keys.global_key("arrival_counter"), total_n) - total_n
        calls = []
        for group in groups:
            calls.append((self.prompt_script_keys(group.prompt_id), self._write_args(group, arrival, now)))
            arrival += len(group.samples)
        steps = await self.scripts.many(self.scripts.prompt_step, calls)
        applied = {
            i: _Item(
                "group",
                g.group_id,
                e.entry_id,
                e.entry_id,
                g.prompt_id,
                len(g.samples),
                _label(g),
                step[0],
                int(step[1]) == 1,
            )
            for i, (g, e, step) in enumerate(zip(groups, where, steps, strict=True))
            if not isinstance(step, Exception)
        }
        out = list(steps)  # failures stay as they are; the rest become WriteResults below
        if applied:
            total, *answers = await self._global_step(list(applied.values()), where[0], now)
            self.arrivals.notify()
            for (i, item), answer in zip(applied.items(), answers, strict=True):
                out[i] = self._result(answer, item.samples, item.delta, 0)
            await self.enforce_capacity(total)
        return out

    @staticmethod
    def _result(answer: int, n: int, delta: bytes, evicted_globally: int) -> WriteResult:
        if answer == RESENT:
            return WriteResult(added=0, duplicates=n, evicted=evicted_globally, resent=True)
        if answer == NOTHING_TO_DO:
            return WriteResult(added=0, duplicates=0, evicted=evicted_globally, resent=False)
        added, dup, evicted = _counts(delta)
        return WriteResult(added=added, duplicates=dup, evicted=evicted + evicted_globally, resent=False)

    async def enforce_capacity(self, total: int | None = None) -> int:
        """Evict the globally oldest samples until the buffer is within ``global_capacity``; returns
        how many. Each round is planned as an intent (reserved, so replicas never double-evict),
        carried out in the victim prompt's slot, then applied globally."""
        cap = self.settings.global_capacity
        if total is not None and total <= cap:
            return 0
        evicted = 0
        for _ in range(MAX_EVICTION_ROUNDS):
            token = uuid.uuid4().hex
            plan = await self.scripts.plan_eviction(
                keys=[self.stats_key], args=[self.global_prefix, cap, token, repr(time.time())]
            )
            if not plan:
                break
            prompt_id, count, bound = plan[0].decode(), int(plan[1]), plan[2]
            evicted += await self._evict(prompt_id, token, count, bound)
        return evicted

    async def _evict(self, prompt_id: str, token: str, count: int, bound: Any) -> int:
        now = time.time()
        delta, fresh = await self.scripts.prompt_step(
            keys=self.prompt_script_keys(prompt_id),
            args=[
                self.keys.prompt_key(prompt_id, ""),
                "evict",
                token,
                repr(now),
                repr(self.prompt_window),
                count,
                bound,
            ],
        )
        item = _Item("eviction", "", token, "", prompt_id, 0, "", delta, fresh == 1)
        _, answer = await self._global_step([item], None, now)
        return _counts(delta)[2] if answer == APPLIED else 0

    async def recover(self, stale_seconds: float) -> int:
        """Finish or abandon the intents older than ``stale_seconds`` (their writer died between the
        steps): a recorded delta is applied; a write that never reached its prompt is abandoned.
        Returns how many intents were settled."""
        intents = await self.redis.hgetall(self.intents_key)
        settled, now = 0, time.time()
        for token, raw in intents.items():
            intent = msgpack.unpackb(raw, raw=False)
            if now - float(intent["at"]) < stale_seconds:
                continue
            token = token.decode() if isinstance(token, bytes) else token
            if intent["kind"] == "eviction":
                await self._evict(intent["prompt"], token, int(intent["count"]), intent["bound"])
            else:
                delta, _ = await self.scripts.prompt_step(
                    keys=self.prompt_script_keys(intent["prompt"]),
                    args=[
                        self.keys.prompt_key(intent["prompt"], ""),
                        "recover",
                        intent["group_id"],
                        repr(now),
                        repr(self.prompt_window),
                    ],
                )
                if delta:
                    item = _Item(
                        "group",
                        intent["group_id"],
                        token,
                        "",
                        intent["prompt"],
                        int(intent["samples"]),
                        intent["label"],
                        delta,
                        False,
                    )
                    await self._global_step([item], None, now)
                else:
                    await self.redis.hdel(self.intents_key, token)
            settled += 1
        return settled

    def dead_letter_args(self, entry: StreamEntry, reason: str, payload: bytes, n_samples: int) -> list[Any]:
        s = self.settings
        return [
            self.global_prefix,
            self.keys.dead_letters,
            s.dead_letter_maxlen,
            entry.entry_id,
            reason,
            payload[: s.dead_letter_payload_bytes],
            s.consumer_name,
            n_samples,
            repr(time.time()),
            entry.stream,
            entry.group,
        ]

    async def dead_letter(self, letters: list[tuple[StreamEntry, str, bytes, int]]) -> list[Any]:
        """Move bad entries (where, reason, payload, samples) to the dead-letter stream with their reason,
        count them, ack them: one atomic step each. Answers as :meth:`Scripts.many`."""
        return await self.scripts.many(
            self.scripts.dead_letter, [([self.stats_key], self.dead_letter_args(*letter)) for letter in letters]
        )

    # --- figures ---
    async def samples_generated(self) -> int:
        """The generated samples taken in so far (:data:`GENERATED_COUNTER`)."""
        return int(await self.redis.hget(self.stats_key, GENERATED_COUNTER) or 0)

    async def stats(self) -> dict[str, Any]:
        pipe = self.redis.pipeline(transaction=not isinstance(self.redis, RedisCluster))
        pipe.hgetall(self.stats_key)
        pipe.zcard(self.keys.global_key("newest_version"))
        pipe.hgetall(self.keys.global_key("version_counts"))
        pipe.smembers(self.keys.global_key("searchers"))
        pipe.zcard(self.keys.global_key("groups"))
        pipe.hgetall(self.keys.global_key("searcher_samples"))
        raw, prompts, version_counts, searchers, remembered, stored_by = await pipe.execute()
        # Outside the pipeline: redis-py refuses PFCOUNT in a cluster pipeline.
        served_distinct = await self.redis.pfcount(self.served_distinct_key)
        counters = {k.decode(): v for k, v in raw.items()}
        samples = int(counters.get("samples", 0))
        reward_sum = float(counters.get("reward_sum", 0.0))
        out: dict[str, Any] = {
            "prompts": int(prompts),
            "samples": samples,
            "versions": {int(v): int(c) for v, c in sorted(version_counts.items(), key=lambda kv: int(kv[0]))},
            "reward_mean": reward_sum / samples if samples else None,
            "dedup_records": int(remembered),  # group ids remembered to refuse resends (dedup_window_seconds)
        }
        for name in STAT_COUNTERS:
            out[name] = int(counters.get(name, 0))
        out["groups_stored"] = out["groups_ingested"] - out["groups_duplicate"] - out["dead_letters"]
        # Distinct samples served at least once (an estimate within about 1%), against the distinct samples
        # stored over the run (``samples`` less what was evicted is what is left now).
        out["samples_served_distinct"] = int(served_distinct)
        out["samples_stored_total"] = out["samples_ingested"] - out["samples_duplicate"] - out["samples_dead_lettered"]
        by_searcher: dict[str, list[int]] = {}
        for member in searchers:
            sid, _, version = member.decode().rpartition("|")
            by_searcher.setdefault(sid, []).append(int(version))
        out["searcher_versions"] = {k: sorted(v) for k, v in sorted(by_searcher.items())}
        # Samples each searcher added to the buffer (a completion another searcher had stored is its duplicate).
        out["searcher_samples"] = {k.decode(): int(v) for k, v in sorted(stored_by.items())}
        return out
