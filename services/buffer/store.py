"""Redis storage of the replay buffer: two-step atomic writes, dead letters, reads for sampling.

Every change goes through the Lua scripts of :mod:`services.buffer.scripts`, each confined to
one hash slot, so the same code runs on one Redis and on Redis Cluster (``TBA_REDIS_CLUSTER``).
A group is stored by the prompt script in its prompt's slot, then its delta is applied to the
global indexes, counters and the stream ack by one global script call per ingest batch. Both
steps are idempotent, so a crash between them is repaired by replaying (stream entries stay
pending until the global step acks them) or by :meth:`BufferStore.recover` (HTTP writes and
global evictions leave an intent). The service keeps no state of its own; any number of
replicas can share one Redis or one Redis Cluster.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
import uuid
from dataclasses import dataclass
from typing import Any

import msgpack
import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster

from services.buffer import scripts
from tba.codec import pack
from tba.keys import Keys
from tba.schemas import ScoredGroup
from tba.settings import BufferSettings

STAT_COUNTERS = (
    "samples_ingested", "samples_duplicate", "samples_evicted", "samples_dead_lettered",
    "groups_ingested", "groups_duplicate", "dead_letters",
    "samples_served", "sample_requests",
)
# Per-item answers of the global step (scripts.APPLY).
APPLIED, RESENT, NOTHING_TO_DO = 0, 1, 2
# Evictions planned per capacity check at most (each empties at least one prompt's oldest samples).
MAX_EVICTION_ROUNDS = 1000

Redis = aioredis.Redis | RedisCluster


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


@dataclass
class PromptView:
    """One prompt's samples as seen atomically: ids, versions, rewards, copies generated, plus its record."""

    prompt_id: str
    prompt_ids: list[int]
    prompt_text: str
    task: str
    sample_ids: list[bytes]
    versions: list[int]
    rewards: list[float]
    copies: list[int]  # how many times each sample was generated at its stored version


@dataclass(frozen=True)
class Picked:
    """The prompts drawn for a batch: the newest stored version, how many recency picks lead the list."""

    newest: int
    recency_taken: int
    views: list[PromptView]


def sample_id(completion_ids: list[int]) -> str:
    """Digest of the token sequence: exact-duplicate completions share an id (dedup by key)."""
    return hashlib.blake2b(pack(completion_ids), digest_size=8).hexdigest()


def encode_record(sample: Any) -> bytes:
    """The stored form of a sample: only what sampling returns besides reward and version."""
    return pack([sample.completion_ids, sample.logprob_sum, sample.ref_logprob_sum, sample.finish_reason])


def decode_record(data: bytes) -> tuple[list[int], float, float, str]:
    ids, lp, ref_lp, finish = msgpack.unpackb(data, raw=False)
    return ids, lp, ref_lp, finish


@dataclass(frozen=True)
class _Item:
    """One change on its way to the global step: a group (``kind='g'``) or a global eviction (``'e'``)."""

    kind: str
    id: str
    token: str
    entry: str
    prompt_id: str
    n: int
    label: str
    delta: bytes
    fresh: bool

    def args(self) -> list[Any]:
        return [self.kind, self.id, self.token, self.entry, self.prompt_id, self.n, self.label, self.delta,
                "1" if self.fresh else "0"]


def _counts(delta: bytes) -> tuple[int, int, int]:
    d = msgpack.unpackb(delta, raw=False)
    return int(d["a"]), int(d["u"]), int(d["e"])


def _label(group: ScoredGroup) -> str:
    return f"{group.searcher_id}|{group.policy_version}"


class BufferStore:
    def __init__(self, redis: Redis, settings: BufferSettings) -> None:
        self.redis = redis
        self.settings = settings
        self.keys = Keys(settings.namespace)
        self.g = self.keys.global_key("")
        self._prompt = redis.register_script(scripts.PROMPT)
        self._apply = redis.register_script(scripts.APPLY)
        self._intent = redis.register_script(scripts.INTENT)
        self._plan = redis.register_script(scripts.PLAN_EVICTION)
        self._dead = redis.register_script(scripts.DEAD_LETTER)
        self._pick = redis.register_script(scripts.PICK)
        self._read = redis.register_script(scripts.READ_PROMPT)
        self._pin = redis.register_script(scripts.OBJECTIVE)
        self._all = (self._prompt, self._apply, self._intent, self._plan, self._dead, self._pick, self._read,
                     self._pin)
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
        for script in self._all:
            await self.redis.script_load(script.script)

    async def _many(self, script: Any, calls: list[tuple[list[str], list[Any]]]) -> list[Any]:
        """Run one script for many key sets: pipelined on one Redis; concurrently on a cluster, whose
        pipelines refuse scripts. A failed call's exception takes its place in the answers."""
        if isinstance(self.redis, RedisCluster):
            return list(await asyncio.gather(*(script(keys=k, args=a) for k, a in calls), return_exceptions=True))
        pipe = self.redis.pipeline(transaction=False)
        for keys, args in calls:
            await script(keys=keys, args=args, client=pipe)
        return await pipe.execute(raise_on_error=False)

    def _meta(self, prompt_id: str) -> list[str]:
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
            t, r = await self._pin(keys=[self.keys.objective], args=[repr(float(temperature)), reference])
            self._objective = (float(t), r.decode() if isinstance(r, bytes) else str(r))
        pinned_t, pinned_r = self._objective
        if temperature in (None, pinned_t) and reference in (None, pinned_r):
            return None
        stated = "unstated" if temperature is None else f"{temperature:g}"
        return (f"objective mismatch: temperature {stated} and reference model {reference}, but this "
                f"buffer's run (namespace {self.settings.namespace!r}) samples at temperature {pinned_t:g} and scores "
                f"against reference model {pinned_r}: configure TBA_TEMPERATURE and TBA_MODEL alike everywhere, "
                f"or start the new objective in a new TBA_NAMESPACE")

    # --- writes ---
    def _prompt_args(self, group: ScoredGroup, seq0: int, now: float) -> list[Any]:
        """ARGV of the prompt script's write (the group already passed :meth:`check`)."""
        args: list[Any] = [
            self.keys.prompt_key(group.prompt_id, ""), "w", group.group_id, repr(now), repr(self.prompt_window),
            self.settings.per_prompt_capacity, pack(group.prompt_ids), group.prompt_text, group.task,
            group.policy_version, seq0, len(group.samples),
        ]
        for sample in group.samples:
            args += [sample_id(sample.completion_ids), repr(float(sample.reward)), encode_record(sample)]
        return args

    async def _apply_items(self, items: list[_Item], entry: StreamEntry | None, now: float) -> list[int]:
        """The global step for a batch: returns the samples stored, then one answer per item."""
        args: list[Any] = [self.g, repr(now), repr(self.global_window), entry.stream if entry else "",
                           entry.group if entry else "", len(items)]
        for item in items:
            args += item.args()
        return [int(x) for x in await self._apply(keys=[self.g + "stats"], args=args)]

    async def write_group(self, group: ScoredGroup) -> WriteResult:
        """Store one group that did not come from the stream (HTTP): intent, prompt step, global step,
        then the global capacity. Idempotent by group id."""
        n, now, token = len(group.samples), time.time(), uuid.uuid4().hex
        intent = pack({"kind": "g", "p": group.prompt_id, "id": group.group_id, "n": n, "label": _label(group),
                       "at": now})
        seq0 = await self._intent(keys=[self.g + "intents"], args=[self.g, token, intent, n])
        delta, fresh = await self._prompt(keys=self._meta(group.prompt_id), args=self._prompt_args(group, seq0, now))
        item = _Item("g", group.group_id, token, "", group.prompt_id, n, _label(group), delta, fresh == 1)
        total, answer = await self._apply_items([item], None, now)
        evicted = await self.enforce_capacity(total)
        return self._result(answer, n, delta, evicted)

    async def write_entries(self, groups: list[ScoredGroup], where: list[StreamEntry]) -> list[WriteResult | Exception]:
        """Store groups read from the stream (each passed :meth:`check`) and ack their entries: one prompt
        step per group (pipelined), one global step for the batch. An exception in the list is that
        group's prompt-step failure (the entry stays pending); a failure of the global step raises."""
        if not groups:
            return []
        now = time.time()
        total_n = sum(len(g.samples) for g in groups)
        seq = await self.redis.incrby(self.g + "seq", total_n) - total_n
        calls = []
        for group in groups:
            calls.append((self._meta(group.prompt_id), self._prompt_args(group, seq, now)))
            seq += len(group.samples)
        steps = await self._many(self._prompt, calls)
        applied = {i: _Item("g", g.group_id, e.entry_id, e.entry_id, g.prompt_id, len(g.samples), _label(g),
                            step[0], int(step[1]) == 1)
                   for i, (g, e, step) in enumerate(zip(groups, where, steps, strict=True))
                   if not isinstance(step, Exception)}
        out = list(steps)  # failures stay as they are; the rest become WriteResults below
        if applied:
            total, *answers = await self._apply_items(list(applied.values()), where[0], now)
            for (i, item), answer in zip(applied.items(), answers, strict=True):
                out[i] = self._result(answer, item.n, item.delta, 0)
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
            plan = await self._plan(keys=[self.g + "stats"], args=[self.g, cap, token, repr(time.time())])
            if not plan:
                break
            prompt_id, k, bound = plan[0].decode(), int(plan[1]), plan[2]
            evicted += await self._evict(prompt_id, token, k, bound)
        return evicted

    async def _evict(self, prompt_id: str, token: str, k: int, bound: Any) -> int:
        now = time.time()
        delta, fresh = await self._prompt(keys=self._meta(prompt_id), args=[
            self.keys.prompt_key(prompt_id, ""), "e", token, repr(now), repr(self.prompt_window), k, bound])
        item = _Item("e", "", token, "", prompt_id, 0, "", delta, fresh == 1)
        _, answer = await self._apply_items([item], None, now)
        return _counts(delta)[2] if answer == APPLIED else 0

    async def recover(self, stale_seconds: float) -> int:
        """Finish or abandon the intents older than ``stale_seconds`` (their writer died between the
        steps): a recorded delta is applied; a write that never reached its prompt is abandoned.
        Returns how many intents were settled."""
        intents = await self.redis.hgetall(self.g + "intents")
        settled, now = 0, time.time()
        for token, raw in intents.items():
            intent = msgpack.unpackb(raw, raw=False)
            if now - float(intent["at"]) < stale_seconds:
                continue
            token = token.decode()
            if intent["kind"] == "e":
                await self._evict(intent["p"], token, int(intent["k"]), intent["bound"])
            else:
                delta, _ = await self._prompt(keys=self._meta(intent["p"]), args=[
                    self.keys.prompt_key(intent["p"], ""), "r", intent["id"], repr(now), repr(self.prompt_window)])
                if delta:
                    item = _Item("g", intent["id"], token, "", intent["p"], int(intent["n"]), intent["label"],
                                 delta, False)
                    await self._apply_items([item], None, now)
                else:
                    await self.redis.hdel(self.g + "intents", token)
            settled += 1
        return settled

    def dead_letter_args(self, entry: StreamEntry, reason: str, payload: bytes, n_samples: int) -> list[Any]:
        s = self.settings
        return [self.g, self.keys.dead_letters, s.dead_letter_maxlen, entry.entry_id, reason,
                payload[: s.dead_letter_payload_bytes], s.consumer_name, n_samples, repr(time.time()),
                entry.stream, entry.group]

    async def dead_letter(self, letters: list[tuple[StreamEntry, str, bytes, int]]) -> list[Any]:
        """Move bad entries (where, reason, payload, samples) to the dead-letter stream with their reason,
        count them, ack them: one atomic step each. Answers as :meth:`_many`."""
        return await self._many(self._dead, [([self.g + "stats"], self.dead_letter_args(*letter))
                                             for letter in letters])

    # --- reads for sampling ---
    async def pick_prompts(self, *, trainer_version: int, recent_versions: int, max_staleness: int | None,
                           only_version: int | None, num_prompts: int, recency_slots: int,
                           uniforms: list[float]) -> Picked | int:
        """Draw the batch's prompts from the global indexes, then read each one atomically.

        Returns the number of eligible prompts instead when it is below ``num_prompts``. A prompt
        that changed between the two reads may no longer fit its branch: the sampler draws again."""
        args = [self.g, trainer_version, recent_versions,
                "" if max_staleness is None else max_staleness, "" if only_version is None else only_version,
                num_prompts, recency_slots, *(repr(u) for u in uniforms)]
        out = await self._pick(keys=[self.g + "pmax"], args=args)
        if int(out[0]) < 0:
            return int(out[1])
        prompts = [p.decode() for p in out[4:]]
        raw = await self._many(self._read, [(self._meta(p), [self.keys.prompt_key(p, "")]) for p in prompts])
        for r in raw:
            if isinstance(r, Exception):
                raise r
        views = [_parse_view(p, r) for p, r in zip(prompts, raw, strict=True)]
        return Picked(newest=int(out[0]), recency_taken=int(out[3]), views=views)

    async def records(self, wanted: list[tuple[str, list[bytes]]], served: int) -> list[list[bytes | None]]:
        """The chosen samples' records, and the served counters, in one round trip."""
        pipe = self.redis.pipeline(transaction=False)
        for p, sids in wanted:
            pipe.hmget(self.keys.prompt_key(p, "rec"), sids)
        pipe.hincrby(self.g + "stats", "samples_served", served)
        pipe.hincrby(self.g + "stats", "sample_requests", 1)
        return (await pipe.execute())[:-2]

    # --- stats ---
    async def stats(self) -> dict[str, Any]:
        pipe = self.redis.pipeline(transaction=not isinstance(self.redis, RedisCluster))
        pipe.hgetall(self.g + "stats")
        pipe.zcard(self.g + "pmax")
        pipe.hgetall(self.g + "vcount")
        pipe.smembers(self.g + "searchers")
        pipe.zcard(self.g + "groups")
        raw, prompts, vcount, searchers, remembered = await pipe.execute()
        counters = {k.decode(): v for k, v in raw.items()}
        samples = int(counters.get("samples", 0))
        reward_sum = float(counters.get("reward_sum", 0.0))
        out: dict[str, Any] = {
            "prompts": int(prompts),
            "samples": samples,
            "versions": {int(v): int(c) for v, c in sorted(vcount.items(), key=lambda kv: int(kv[0]))},
            "reward_mean": reward_sum / samples if samples else None,
            "dedup_records": int(remembered),  # group ids remembered to refuse resends (dedup_window_seconds)
        }
        for name in STAT_COUNTERS:
            out[name] = int(counters.get(name, 0))
        out["groups_stored"] = out["groups_ingested"] - out["groups_duplicate"] - out["dead_letters"]
        by_searcher: dict[str, list[int]] = {}
        for member in searchers:
            sid, _, version = member.decode().rpartition("|")
            by_searcher.setdefault(sid, []).append(int(version))
        out["searcher_versions"] = {k: sorted(v) for k, v in sorted(by_searcher.items())}
        return out


def _parse_view(prompt_id: str, raw: list[Any]) -> PromptView:
    """A READ_PROMPT answer; a prompt emptied since the pick reads as having no samples."""
    if not raw:
        return PromptView(prompt_id, [], "", "", [], [], [], [])
    ids, text, task, *fields = raw
    return PromptView(
        prompt_id=prompt_id, prompt_ids=msgpack.unpackb(ids), prompt_text=(text or b"").decode(),
        task=(task or b"").decode(), sample_ids=fields[0::4],
        versions=[int(score) // scripts.VERSION_SHIFT for score in fields[1::4]],
        rewards=[float(r) for r in fields[2::4]], copies=[int(c) for c in fields[3::4]])
