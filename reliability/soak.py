"""Soak: the buffer under many producers and a sampling client for a long while.

``python -m reliability.soak --minutes 30`` (``make soak``) starts a real Redis with AOF (the flags
``tba up`` uses) and a real ``tba buffer`` process whose capacities are small enough that both
evictions run all the time, then keeps up, for the whole run:

- ``--producers`` processes, each XADDing valid scored groups to the trajectory stream at
  ``--group-rate`` groups/s (a searcher's traffic), over ``--prompts`` prompts, with the policy
  version rising every ``--version-seconds``;
- one process POSTing groups to ``/v1/groups`` at ``--http-rate`` (a producer without Redis);
- one sampling client POSTing ``/v1/sample`` back to back (at most ``--sample-rate`` a second),
  as the trainer does, and checking each answer is a whole batch.

Every ``--probe-seconds`` it reads the buffer's RSS (/proc), Redis ``used_memory``, the key count,
``/v1/stats`` and the ingest's lag; every window it also sums the bytes of the dedup records
(group ids kept ``dedup_window_seconds`` so that a resent group is stored once).

Pass, from the end of the warm-up to the end: the buffer's RSS grows by less than 10%; Redis's
``used_memory`` grows by less than 10% (stored samples are capped; dedup records are capped by the
window, set shorter than the warm-up here, so the run reaches the bound it would reach in days at
the default window); 0 errors (every answer that is neither 2xx nor 409, every failed XADD, every
dead letter, every group sent and not ingested); the sample latency's p99 in the last window at
most twice that of the first window after the warm-up. The producers are light on purpose (a
pool of sample lists built once, then one msgpack pack per group, no pydantic): on a 2-core
machine the buffer and Redis must get the CPU, not the load generator.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import random
import secrets
import statistics
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from multiprocessing.sharedctypes import Synchronized
from pathlib import Path
from typing import Any, Protocol

import httpx
import msgpack
import redis

from reliability.payloads import REFERENCE, TEMPERATURE, group_dict
from reliability.report import finish, table, write_result
from reliability.services import BufferProcess, suite_redis
from tba.codec import MSGPACK_MEDIA_TYPE
from tba.keys import STREAM_FIELD, Keys
from tba.process_tree import cpu_seconds, rss_bytes
from tba.redis_client import sync_client
from tba.settings import BufferSettings

GROWTH_LIMIT = 0.10  # RSS and Redis memory: at most 10% more at the end than at the end of the warm-up
LATENCY_LIMIT = 2.0  # p99 of the last window: at most twice the first window's after the warm-up
KEYS = Keys()


@dataclass(frozen=True)
class SoakConfig:
    minutes: float = 30.0
    warmup_minutes: float = 5.0
    window_seconds: float = 60.0
    probe_seconds: float = 5.0
    producers: int = 4
    group_rate: float = 25.0  # groups/s per stream producer
    http_rate: float = 5.0  # groups/s over POST /v1/groups
    sample_rate: float = 20.0  # at most this many sample requests a second
    prompts: int = 2000
    samples_per_group: int = 8
    completion_tokens: int = 24
    version_seconds: float = 10.0
    num_prompts: int = 8  # P and K of each sample request, as a small trainer step asks
    samples_per_prompt: int = 8
    per_prompt_capacity: int = 32  # 2000 prompts x 32 > global_capacity: global eviction runs too
    global_capacity: int = 40_000
    dedup_window_seconds: float = 120.0  # the global record is kept max(60 s, 10%) longer (BufferStore)


# --- load generators ---


def _sample_pool(rng: random.Random, cfg: SoakConfig, size: int = 2048) -> list[list[dict[str, Any]]]:
    """Sample lists built once per producer: distinct completions, so that stored samples are not duplicates."""
    pool = []
    for _ in range(size):
        completions = [
            [rng.randrange(1, 50_000) for _ in range(cfg.completion_tokens)] for _ in range(cfg.samples_per_group)
        ]
        rewards = [float(rng.randrange(2)) for _ in completions]
        pool.append(group_dict("", "", completions, rewards)["samples"])
    return pool


class GroupSource:
    """Valid groups, one msgpack pack each: fresh group id, a random prompt, the current version."""

    def __init__(self, cfg: SoakConfig, name: str, t0: float, seed: int) -> None:
        self.cfg, self.name, self.t0 = cfg, name, t0
        self.rng = random.Random(seed)
        self.pool = _sample_pool(self.rng, cfg)
        self.template = group_dict("", "", [[1]], [0.0], searcher_id=name)
        self.seq = 0

    def next(self) -> bytes:
        self.seq += 1
        group = dict(
            self.template,
            group_id=f"{self.name}-{self.seq}",
            prompt_id=f"q{self.rng.randrange(self.cfg.prompts)}",
            policy_version=version_at(self.cfg, self.t0),
            samples=self.rng.choice(self.pool),
        )
        return msgpack.packb(group, use_bin_type=True)


def version_at(cfg: SoakConfig, t0: float) -> int:
    """The policy version the trainer would be at: one more every ``version_seconds`` since the start."""
    return int((time.time() - t0) / cfg.version_seconds)


class Stop(Protocol):
    """A threading or multiprocessing Event: what a load loop needs to wait on it."""

    def is_set(self) -> bool: ...

    def wait(self, timeout: float | None = None) -> bool: ...


def _paced(rate: float, stop: Stop) -> Iterator[None]:
    """Yield at ``rate`` per second until ``stop`` is set (catching up after a stall, never bursting past it)."""
    interval, nxt = 1.0 / rate, time.monotonic()
    while not stop.is_set():
        yield
        nxt = max(nxt + interval, time.monotonic() - interval)
        stop.wait(max(0.0, nxt - time.monotonic()))


def stream_producer(
    cfg: SoakConfig, index: int, redis_url: str, t0: float, stop: Stop, sent: Synchronized, errors: Synchronized
) -> None:
    """A searcher's traffic: XADD a group to the trajectory stream ``group_rate`` times a second."""
    source = GroupSource(cfg, f"stream-{index}", t0, seed=index)
    client = sync_client(redis_url)
    for _ in _paced(cfg.group_rate, stop):
        try:
            client.xadd(KEYS.trajectories, {STREAM_FIELD: source.next()})
            with sent.get_lock():
                sent.value += 1
        except redis.RedisError:
            with errors.get_lock():
                errors.value += 1


def http_producer(
    cfg: SoakConfig, url: str, token: str, t0: float, stop: Stop, sent: Synchronized, errors: Synchronized
) -> None:
    """A producer that cannot reach Redis: POST /v1/groups ``http_rate`` times a second."""
    source = GroupSource(cfg, "http", t0, seed=10_000)
    headers = {"Authorization": f"Bearer {token}", "Content-Type": MSGPACK_MEDIA_TYPE}
    with httpx.Client(base_url=url, headers=headers, timeout=30) as client:
        for _ in _paced(cfg.http_rate, stop):
            try:
                ok = client.post("/v1/groups", content=source.next()).status_code == 200
            except httpx.HTTPError:
                ok = False
            with (sent if ok else errors).get_lock():
                (sent if ok else errors).value += 1


@dataclass
class SampleLog:
    """What the sampling client saw: (end time, seconds) of each answered request, and the rest by kind."""

    latencies: list[tuple[float, float]] = field(default_factory=list)
    not_enough: int = 0  # 409: fewer eligible prompts than asked (expected only at the very start)
    errors: list[tuple[float, str]] = field(default_factory=list)


def sampling_client(cfg: SoakConfig, url: str, token: str, t0: float, stop: Stop, log: SampleLog) -> None:
    """The trainer's side: POST /v1/sample back to back, msgpack both ways, each answer checked whole."""
    headers = {"Authorization": f"Bearer {token}", "Content-Type": MSGPACK_MEDIA_TYPE}
    with httpx.Client(base_url=url, headers=headers, timeout=30) as client:
        for _ in _paced(cfg.sample_rate, stop):
            body = msgpack.packb(
                {
                    "num_prompts": cfg.num_prompts,
                    "samples_per_prompt": cfg.samples_per_prompt,
                    "trainer_version": version_at(cfg, t0),
                    "temperature": TEMPERATURE,
                    "reference": REFERENCE,
                }
            )
            start = time.monotonic()
            try:
                r = client.post("/v1/sample", content=body)
            except httpx.HTTPError as err:
                log.errors.append((time.monotonic(), f"{type(err).__name__}: {err}"))
                continue
            seconds = time.monotonic() - start
            if r.status_code == 409:
                log.not_enough += 1
            elif r.status_code != 200:
                log.errors.append((time.monotonic(), f"{r.status_code}: {r.text[:300]}"))
            elif not _whole_batch(r.content, cfg):
                log.errors.append((time.monotonic(), f"200 with a batch of the wrong shape: {r.content[:200]!r}"))
            else:
                log.latencies.append((time.monotonic(), seconds))


def _whole_batch(content: bytes, cfg: SoakConfig) -> bool:
    """The answer is msgpack holding exactly P groups of K samples."""
    try:
        groups = msgpack.unpackb(content)["groups"]
        return len(groups) == cfg.num_prompts and all(len(g["samples"]) == cfg.samples_per_prompt for g in groups)
    except (ValueError, KeyError, TypeError):
        return False


# --- measurements ---


@dataclass
class Probe:
    t: float  # seconds since the load started
    rss: int
    used_memory: int
    keys: int
    stats: dict[str, Any]
    lag: int  # stream entries not yet delivered to the buffer, plus those delivered and not acked
    buffer_cpu: float  # CPU seconds the buffer process has used so far
    machine: tuple[int, int]  # busy and total jiffies of all CPUs so far (anything else running shows here)
    aof_rewrites: int


@dataclass
class DedupFigures:
    """The records that let the buffer refuse a resent group: per group, its id in its prompt's record
    (``P groups``, with the prompt's delta in ``P deltas``) and in the global one (``G groups``, ``G group_tokens``)."""

    global_records: int  # = /v1/stats dedup_records
    global_bytes: int
    prompt_records: int
    prompt_bytes: int

    @property
    def bytes(self) -> int:
        return self.global_bytes + self.prompt_bytes

    @property
    def bytes_per_group(self) -> float:
        """What remembering one group costs once the window is long against the prompts' revisits (each group
        then has one record of each kind): MEMORY USAGE averaged over the records of each kind, summed."""
        return self.global_bytes / max(1, self.global_records) + self.prompt_bytes / max(1, self.prompt_records)


@dataclass
class Window:
    index: int
    start: float
    end: float
    warmup: bool
    rss: int
    used_memory: int
    keys: int
    samples: int
    evicted: int
    groups_per_s: float
    requests: int
    p50_ms: float
    p99_ms: float
    errors: int
    lag: int
    buffer_cpu: float  # share of one core the buffer used
    machine_cpu: float  # share of all cores busy, with whatever else ran on the machine
    aof_rewrites: int  # AOF rewrites (a fork each) Redis did in the window
    dedup: DedupFigures


def probe(client: redis.Redis, buffer: BufferProcess, t: float) -> Probe:
    stats = httpx.get(f"{buffer.url}/v1/stats", timeout=30).raise_for_status().json()
    pending = sum(int(g["pending"]) + int(g.get("lag") or 0) for g in client.xinfo_groups(KEYS.trajectories))
    return Probe(
        t=t,
        rss=rss_bytes(buffer.pid),
        used_memory=int(client.info("memory")["used_memory"]),
        keys=int(client.dbsize()),
        stats=stats,
        lag=pending,
        buffer_cpu=cpu_seconds(buffer.pid),
        machine=machine_jiffies(),
        aof_rewrites=int(client.info("persistence")["aof_rewrites"]),
    )


def machine_jiffies() -> tuple[int, int]:
    """(busy, total) jiffies of all CPUs since boot, from the first line of /proc/stat."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]  # idle, iowait
    return sum(fields) - idle, sum(fields)


def dedup_figures(client: redis.Redis, prompts: int) -> DedupFigures:
    """Count and bytes of the dedup records (bytes exact: ``MEMORY USAGE key SAMPLES 0``)."""
    pipe = client.pipeline(transaction=False)
    prompt_sets = [KEYS.prompt_key(f"q{i}", "groups") for i in range(prompts)]
    prompt_keys = prompt_sets + [KEYS.prompt_key(f"q{i}", "deltas") for i in range(prompts)]
    global_keys = [KEYS.global_key("groups"), KEYS.global_key("group_tokens")]
    for name in prompt_keys + global_keys:
        pipe.memory_usage(name, samples=0)
    for name in prompt_sets + global_keys[:1]:  # the sorted sets: one member per record
        pipe.zcard(name)
    out = [n or 0 for n in pipe.execute()]  # MEMORY USAGE of a missing key: None
    sizes, counts = out[: len(prompt_keys) + 2], out[len(prompt_keys) + 2 :]
    return DedupFigures(
        global_records=counts[-1],
        global_bytes=sum(sizes[-2:]),
        prompt_records=sum(counts[:-1]),
        prompt_bytes=sum(sizes[:-2]),
    )


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


# --- the run ---


@dataclass
class SoakResult:
    config: SoakConfig
    windows: list[Window]
    stream_sent: int
    http_sent: int
    producer_errors: int
    sample_errors: list[tuple[float, str]]
    not_enough: int
    final: dict[str, Any]
    empty_used_memory: int
    drained: bool
    buffer_stopped_cleanly: bool

    @property
    def measured(self) -> list[Window]:
        return [w for w in self.windows if not w.warmup]

    def growth(self, attr: str) -> float:
        """Relative growth of ``attr`` from the end of the warm-up (its last window) to the last window."""
        warm = [w for w in self.windows if w.warmup]
        base = getattr(warm[-1] if warm else self.windows[0], attr)
        return getattr(self.windows[-1], attr) / base - 1.0

    def errors(self) -> list[str]:
        out = [f"{self.producer_errors} producer sends failed"] if self.producer_errors else []
        out += [f"sample request at {t:.0f} s: {e}" for t, e in self.sample_errors[:20]]
        if len(self.sample_errors) > 20:
            out.append(f"... {len(self.sample_errors) - 20} more failed sample requests")
        if self.final["dead_letters"]:
            out.append(f"{self.final['dead_letters']} valid groups were dead-lettered")
        sent = self.stream_sent + self.http_sent
        if not self.drained or self.final["groups_ingested"] != sent:
            out.append(f"{sent} groups sent, {self.final['groups_ingested']} ingested after the drain")
        if not self.final["ingest"]["healthy"]:
            out.append(f"the ingest is unhealthy: {self.final['ingest']['last_error']}")
        if not self.buffer_stopped_cleanly:
            out.append("the buffer did not shut down gracefully on SIGTERM")
        return out

    def problems(self) -> list[str]:
        """Every way the run missed its pass criteria (empty: it passed)."""
        out = self.errors()
        if len(self.measured) < 2:
            return out + [f"only {len(self.measured)} windows after the warm-up: run longer"]
        if (g := self.growth("rss")) >= GROWTH_LIMIT:
            out.append(f"buffer RSS grew {g:.1%} after the warm-up (limit {GROWTH_LIMIT:.0%})")
        if (g := self.growth("used_memory")) >= GROWTH_LIMIT:
            out.append(f"Redis used_memory grew {g:.1%} after the warm-up (limit {GROWTH_LIMIT:.0%})")
        first, last = self.measured[0], self.measured[-1]
        if not last.p99_ms <= LATENCY_LIMIT * first.p99_ms:
            out.append(
                f"sample p99 {last.p99_ms:.1f} ms in the last window, over {LATENCY_LIMIT:g} x "
                f"{first.p99_ms:.1f} ms of the first after the warm-up"
            )
        if self.final["samples_evicted"] == 0:
            out.append("nothing was evicted: the capacities were not exercised")
        return out


def soak(cfg: SoakConfig, redis_url: str, workdir: Path, progress: bool = False) -> SoakResult:
    """Run the soak against a fresh buffer on ``redis_url`` (an empty Redis of the caller's)."""
    token = secrets.token_hex(16)
    client = sync_client(redis_url)
    empty_used_memory = int(client.info("memory")["used_memory"])
    buffer = BufferProcess(
        redis_url,
        workdir / "buffer.log",
        token=token,
        consumer_name="soak",
        per_prompt_capacity=cfg.per_prompt_capacity,
        global_capacity=cfg.global_capacity,
        dedup_window_seconds=cfg.dedup_window_seconds,
    ).start()
    try:
        windows, log, sent_counts = _load(cfg, client, buffer, redis_url, token, progress)
        drained, final = _drain(client, buffer, sum(sent_counts[:2]))
    finally:
        stopped = buffer.stop()
        client.close()
    return SoakResult(
        config=cfg,
        windows=windows,
        stream_sent=sent_counts[0],
        http_sent=sent_counts[1],
        producer_errors=sent_counts[2],
        sample_errors=log.errors,
        not_enough=log.not_enough,
        final=final,
        empty_used_memory=empty_used_memory,
        drained=drained,
        buffer_stopped_cleanly=stopped,
    )


def _load(
    cfg: SoakConfig, client: redis.Redis, buffer: BufferProcess, redis_url: str, token: str, progress: bool
) -> tuple[list[Window], SampleLog, tuple[int, int, int]]:
    """Run the producers and the sampling client for ``cfg.minutes``, measuring each window (printing a line
    each when ``progress``); stop them all.

    Returns the windows, what the sampling client saw, and (groups XADDed, groups POSTed, failed sends)."""
    ctx = mp.get_context("spawn")  # a clean interpreter per producer: nothing of the caller's threads or sockets
    stop_producers = ctx.Event()
    stream_sent, http_sent, producer_errors = ctx.Value("q", 0), ctx.Value("q", 0), ctx.Value("q", 0)
    t0 = time.time()
    procs = [
        ctx.Process(
            target=stream_producer,
            name=f"soak-producer-{i}",
            daemon=True,
            args=(cfg, i, redis_url, t0, stop_producers, stream_sent, producer_errors),
        )
        for i in range(cfg.producers)
    ]
    procs.append(
        ctx.Process(
            target=http_producer,
            name="soak-http-producer",
            daemon=True,
            args=(cfg, buffer.url, token, t0, stop_producers, http_sent, producer_errors),
        )
    )
    stop_sampling = threading.Event()
    log = SampleLog()
    sampler = threading.Thread(
        target=sampling_client, name="soak-sampler", daemon=True, args=(cfg, buffer.url, token, t0, stop_sampling, log)
    )
    windows: list[Window] = []
    try:
        for p in procs:
            p.start()
        sampler.start()
        start = time.monotonic()
        n_windows = max(1, round(cfg.minutes * 60 / cfg.window_seconds))
        warmup_windows = round(cfg.warmup_minutes * 60 / cfg.window_seconds)
        previous = probe(client, buffer, 0.0)
        for index in range(n_windows):
            w_start, w_end = index * cfg.window_seconds, (index + 1) * cfg.window_seconds
            probes: list[Probe] = []
            while (now := time.monotonic() - start) < w_end:
                time.sleep(min(cfg.probe_seconds, max(0.0, w_end - now)))
                if not buffer.alive():
                    raise RuntimeError(f"the buffer died:\n{buffer.log_tail()}")
                probes.append(probe(client, buffer, time.monotonic() - start))
            windows.append(
                _window(
                    index,
                    w_start,
                    w_end,
                    index < warmup_windows,
                    probes,
                    previous,
                    log,
                    start,
                    dedup_figures(client, cfg.prompts),
                )
            )
            previous = probes[-1]
            if progress:
                w = windows[-1]
                print(
                    f"soak: window {index + 1}/{n_windows}{' (warm-up)' if w.warmup else ''}: "
                    f"RSS {w.rss / 2**20:.1f} MiB, Redis {w.used_memory / 2**20:.1f} MiB, {w.samples} samples, "
                    f"p50/p99 {w.p50_ms:.1f}/{w.p99_ms:.1f} ms, {w.errors} errors, lag {w.lag}, buffer CPU "
                    f"{w.buffer_cpu:.0%}, machine CPU {w.machine_cpu:.0%}",
                    flush=True,
                )
    finally:
        stop_producers.set()
        stop_sampling.set()
        for p in procs:
            p.join(30)
            if p.is_alive():
                p.kill()
        sampler.join(60)
    return windows, log, (stream_sent.value, http_sent.value, producer_errors.value)


def _drain(client: redis.Redis, buffer: BufferProcess, sent: int) -> tuple[bool, dict[str, Any]]:
    """Wait (2 minutes at most) until the buffer has ingested every group sent; (whether it did, its stats)."""
    drained, final = False, {}
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        final = httpx.get(f"{buffer.url}/v1/stats", timeout=30).json()
        if final["groups_ingested"] >= sent and probe(client, buffer, 0).lag == 0:
            drained = True
            break
        time.sleep(0.5)
    return drained, final


def _window(
    index: int,
    start: float,
    end: float,
    warmup: bool,
    probes: list[Probe],
    previous: Probe,
    log: SampleLog,
    t_start: float,
    dedup: DedupFigures,
) -> Window:
    """One window's figures: medians of the probes (steady values, not one lucky reading), latency percentiles."""
    lat = [s * 1000 for t, s in log.latencies if start <= t - t_start < end]
    errors = sum(1 for t, _ in log.errors if start <= t - t_start < end)
    last = probes[-1]
    seconds = last.t - previous.t
    busy, total = (now - then for now, then in zip(last.machine, previous.machine, strict=True))
    return Window(
        index=index,
        start=start,
        end=end,
        warmup=warmup,
        buffer_cpu=(last.buffer_cpu - previous.buffer_cpu) / seconds,
        machine_cpu=busy / max(1, total),
        aof_rewrites=last.aof_rewrites - previous.aof_rewrites,
        rss=int(statistics.median(p.rss for p in probes)),
        used_memory=int(statistics.median(p.used_memory for p in probes)),
        keys=last.keys,
        samples=last.stats["samples"],
        evicted=last.stats["samples_evicted"],
        groups_per_s=(last.stats["groups_ingested"] - previous.stats["groups_ingested"]) / seconds,
        requests=len(lat),
        p50_ms=_percentile(lat, 0.50),
        p99_ms=_percentile(lat, 0.99),
        errors=errors,
        lag=max(p.lag for p in probes),
        dedup=dedup,
    )


def render(result: SoakResult, minutes_asked: float) -> str:
    """The "soak" section of RELIABILITY.md."""
    cfg, problems = result.config, result.problems()
    final, measured = result.final, result.measured
    stored = final["samples"]
    last = result.windows[-1]
    sample_bytes = (last.used_memory - result.empty_used_memory - last.dedup.bytes) / max(1, stored)
    per_group = last.dedup.bytes_per_group
    default_window = BufferSettings.model_fields["dedup_window_seconds"].default
    rate = final["groups_ingested"] / (cfg.minutes * 60)
    verdict = "PASS" if not problems else "FAIL"
    lines = [
        f"**{verdict}** ({minutes_asked:g} minutes, the first {cfg.warmup_minutes:g} warm-up): buffer RSS "
        f"{result.growth('rss'):+.1%} and Redis used_memory {result.growth('used_memory'):+.1%} from the end of the "
        f"warm-up to the end (limit +{GROWTH_LIMIT:.0%} each); {len(result.errors())} errors; sample p99 "
        f"{measured[0].p99_ms if measured else float('nan'):.1f} ms in the first window after the warm-up, "
        f"{last.p99_ms:.1f} ms in the last (limit {LATENCY_LIMIT:g}x).",
        "",
        f"Load: {cfg.producers} producer processes XADDing {cfg.group_rate:g} groups/s each to the trajectory "
        f"stream, one POSTing {cfg.http_rate:g} groups/s to `/v1/groups`; groups of {cfg.samples_per_group} samples "
        f"of {cfg.completion_tokens} tokens over {cfg.prompts} prompts, the version rising every "
        f"{cfg.version_seconds:g} s; a sampling client POSTing `/v1/sample` (P={cfg.num_prompts}, "
        f"K={cfg.samples_per_prompt}, msgpack) back to back, at most {cfg.sample_rate:g}/s. Buffer: "
        f"per_prompt_capacity {cfg.per_prompt_capacity}, global_capacity {cfg.global_capacity}, "
        f"dedup_window_seconds {cfg.dedup_window_seconds:g}; Redis with AOF (everysec), noeviction.",
        "",
        f"Totals: {result.stream_sent} groups XADDed, {result.http_sent} POSTed, {final['groups_ingested']} ingested "
        f"({rate:.1f}/s; all of them: {'yes' if result.drained else 'NO'}), {final['samples_evicted']} samples "
        f"evicted, {final['samples_duplicate']} duplicates, {final['dead_letters']} dead letters; "
        f"{sum(w.requests for w in result.windows)} sample requests answered, {result.not_enough} × 409 "
        f"(not enough prompts yet), {len(result.sample_errors)} failed.",
        "",
        "Memory: at the end Redis held "
        f"{stored} samples and {last.dedup.global_records} remembered group ids in {last.used_memory / 2**20:.1f} "
        f"MiB ({result.empty_used_memory / 2**20:.1f} MiB empty): about {sample_bytes:.0f} bytes per stored sample "
        f"({sample_bytes * cfg.samples_per_group:.0f} per stored group of {cfg.samples_per_group}; indexes and stream "
        f"included, dedup records not). Remembering a group costs about {per_group:.0f} bytes "
        f"({last.dedup.global_bytes / max(1, last.dedup.global_records):.0f} in the global record, "
        f"{last.dedup.prompt_bytes / max(1, last.dedup.prompt_records):.0f} in its prompt's, delta included), for "
        f"dedup_window_seconds: at this run's {rate:.0f} groups/s and the default window of {default_window:g} s "
        f"that is about {rate * default_window * per_group / 2**20:.0f} MiB on top of the samples, a lower bound: "
        f"a prompt holding more than 128 records (a long window, a prompt revisited often) leaves Redis's compact "
        f"listpack encoding for a costlier one. This run's window, {cfg.dedup_window_seconds:g} s, ends inside the "
        f"warm-up so that the dedup records reach their bound before judging.",
        "",
    ]
    lines.append(
        table(
            [
                "window",
                "end (s)",
                "buffer RSS (MiB)",
                "Redis used (MiB)",
                "keys",
                "samples",
                "evicted",
                "groups/s",
                "remembered groups",
                "dedup MiB",
                "requests",
                "p50 (ms)",
                "p99 (ms)",
                "failed requests",
                "max lag",
                "buffer CPU",
                "machine CPU",
                "AOF rewrites",
            ],
            [
                [
                    f"{w.index + 1}{' (warm-up)' if w.warmup else ''}",
                    f"{w.end:.0f}",
                    f"{w.rss / 2**20:.1f}",
                    f"{w.used_memory / 2**20:.1f}",
                    w.keys,
                    w.samples,
                    w.evicted,
                    f"{w.groups_per_s:.1f}",
                    w.dedup.global_records,
                    f"{w.dedup.bytes / 2**20:.2f}",
                    w.requests,
                    f"{w.p50_ms:.1f}",
                    f"{w.p99_ms:.1f}",
                    w.errors,
                    w.lag,
                    f"{w.buffer_cpu:.0%}",
                    f"{w.machine_cpu:.0%}",
                    w.aof_rewrites,
                ]
                for w in result.windows
            ],
        )
    )
    if problems:
        lines += ["Problems:", ""] + [f"- {p}" for p in problems]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    defaults = SoakConfig()
    parser = argparse.ArgumentParser(prog="python -m reliability.soak", description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=defaults.minutes, help="length of the run, warm-up included")
    parser.add_argument(
        "--warmup-minutes",
        type=float,
        default=None,
        help="warm-up, not judged (default: 5, or 40%% of a run shorter than 12.5 minutes)",
    )
    parser.add_argument(
        "--window-seconds",
        type=float,
        default=None,
        help="length of a measuring window (default: 60, or 30 for runs under 10 minutes)",
    )
    parser.add_argument("--producers", type=int, default=defaults.producers)
    parser.add_argument("--group-rate", type=float, default=defaults.group_rate, help="groups/s per stream producer")
    parser.add_argument("--http-rate", type=float, default=defaults.http_rate, help="groups/s POSTed to /v1/groups")
    parser.add_argument("--sample-rate", type=float, default=defaults.sample_rate, help="most sample requests/s")
    parser.add_argument("--workdir", type=Path, default=None, help="where logs go (default: runs/soak-*)")
    parser.add_argument(
        "--redis-url", default=None, help="an empty Redis of the caller's (default: a redis-server of the run's own)"
    )
    parser.add_argument("--no-report", action="store_true", help="print the section instead of writing RELIABILITY.md")
    parser.add_argument("--result", type=Path, default=None, help="also write what the run found as JSON here")
    args = parser.parse_args(argv)
    cfg = config_for(
        args.minutes,
        args.warmup_minutes,
        args.window_seconds,
        producers=args.producers,
        group_rate=args.group_rate,
        http_rate=args.http_rate,
        sample_rate=args.sample_rate,
    )
    workdir = args.workdir or Path("runs") / time.strftime("soak-%Y%m%d-%H%M%S")
    workdir.mkdir(parents=True, exist_ok=True)
    with suite_redis(workdir, args.redis_url) as redis_url:
        result = soak(cfg, redis_url, workdir, progress=True)
    print(f"soak: logs in {workdir}")
    if args.result:
        write_result(args.result, result, result.problems(), errors=result.errors(), measured=result.measured)
    return finish(
        "soak",
        render(result, args.minutes),
        result.problems(),
        sys.argv[1:] if argv is None else argv,
        write=not args.no_report,
    )


def config_for(
    minutes: float, warmup_minutes: float | None = None, window_seconds: float | None = None, **overrides: Any
) -> SoakConfig:
    """The configuration of a run of ``minutes``: a shorter run gets a shorter warm-up, windows and dedup window
    (the window must end well inside the warm-up for the dedup records to reach their bound before judging)."""
    warmup = warmup_minutes if warmup_minutes is not None else min(5.0, 0.4 * minutes)
    window = window_seconds if window_seconds is not None else (60.0 if minutes >= 10 else 30.0)
    dedup = min(120.0, max(10.0, (warmup * 60 - 60) / 2))
    return SoakConfig(
        minutes=minutes, warmup_minutes=warmup, window_seconds=window, dedup_window_seconds=dedup, **overrides
    )


if __name__ == "__main__":
    sys.exit(main())
