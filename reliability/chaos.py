"""Chaos: kill every part of a running system at random moments, take Redis away, fill the checkpoint
volume; then check that nothing was lost, nothing was left behind, and the system still learned.

``python -m reliability.chaos [--minutes N] [--kills N] [--seed S]`` (``make chaos``) runs one ``tba up``
(a real redis-server with AOF, the buffer, the trainer, two searchers on vLLM's CPU engine; ``tba up``'s
defaults but for three settings, each explained in :meth:`System.start`) and works on it from outside:

1. From the trainer's first checkpoint on, the faults, in a random order (``--seed``), each after a
   random pause, spread over the run up to a calm last stretch (``--calm`` seconds):

   - *kill PART*: SIGKILL of the part's service process (redis-server, the buffer, the trainer, each
     searcher), ``--kills`` times each; the supervisor of ``tba up`` restarts it.
   - *Redis unreachable*: redis-server frozen with SIGSTOP for ``--outage`` seconds, then SIGCONT.
     Every client times out as if the network were gone; nothing is restarted. The searchers spill
     what they generate to disk meanwhile.
   - *checkpoint volume full*: for ``--disk-full`` seconds the trainer cannot grow a file past a
     limit a few MB above its logs (RLIMIT_FSIZE, set on the running process with prlimit(2), which
     needs no root): every checkpoint write fails partway, as on a full volume (EFBIG where a full
     disk says ENOSPC: the same failed write to the same code). Its logs stay below the limit.

2. The calm stretch: every part comes back, the searchers catch up with the newest checkpoint, and
   ``tba up`` ends at ``--minutes`` and writes its summary.

3. The pass criteria, each checked and reported (RELIABILITY.md, section "chaos"):

   - published = stored, by group id: the set of group ids that reached the trajectory stream equals
     the set the buffer stored; every stream entry was ingested once (a resent group counted as a
     duplicate), none is pending, none dead-lettered, and no searcher is left with spilled groups;
   - versions strictly increase and every announced checkpoint is complete: each announcement is
     verified (content hash) the moment it arrives, no version goes back, none names two checkpoints;
   - the trainer resumes: every restart after a kill resumed from a checkpoint at least as new as the
     newest one announced before the kill;
   - the searchers end on the newest version: in the calm stretch each reaches the version that was
     newest when every part was back up;
   - no process of the run is left once ``tba up`` has exited;
   - held-out accuracy still improves: the last evaluation beats the base model's;
   - and each fault did what it should: the part restarted; the searchers spilled during the outage
     and drained afterwards; the trainer said it could not write, kept its last good checkpoint
     (``LATEST`` still verifies) and published again once writes worked.

How "published" is counted: as soon as Redis is up, an audit consumer group is put on the trajectory
stream. The buffer trims acknowledged entries only while its own group is the stream's only one, so
with the audit group there the stream keeps every entry ever published. After the run a redis-server
of our own reopens a copy of the run's AOF (what Redis really kept) and the stream's group ids are
compared with the ids of the stored groups (the buffer keeps them for its dedup window, 7 days). A
reader also follows the stream during the run, so an entry Redis acknowledged and then lost in a
kill would show up as published but missing.

The test suite runs a short form (tests/reliability/test_chaos.py: ``--minutes 4 --kills 1``, its findings read
from ``--result``) with the same criteria.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import resource
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import httpx
import redis

from reliability.report import finish, table, write_result
from reliability.services import ROOT
from tba.checkpoints import CheckpointError, CheckpointStore, parse_manifest
from tba.codec import unpack
from tba.keys import STREAM_FIELD, Keys
from tba.local.commands import tba_command
from tba.local.lifetime import guarded_service
from tba.process_tree import alive, command_line, descendants, running_with
from tba.redis_client import sync_client
from tba.redis_server import RedisServer

NAMESPACE = "chaos"
AUDIT_GROUP = "chaos-audit"
RESTART_TIMEOUT = 180.0  # the longest a part may take to be running again (the supervisor backs off up to 30 s)
FAULT_OVERHEAD_SECONDS = 5.0  # what a fault takes besides its own length: the restart, or the recovery, it waits for
T = TypeVar("T")


@dataclass
class ChaosConfig:
    """One chaos run: its length, its faults, and what ``tba up`` is started with."""

    minutes: float = 12.0
    kills: int = 3  # SIGKILLs of each part
    seed: int = 0
    searchers: int = 2
    outage_seconds: float = 60.0
    disk_full_seconds: float = 45.0
    calm_seconds: float = 150.0  # the end of the run without faults, to recover and catch up
    eval_every: float = 30.0
    eval_prompts: int = 200
    base_model: Path | None = None  # default: the cached SFT base model

    @property
    def parts(self) -> list[str]:
        return ["redis", "buffer", "trainer", *(f"searcher-{i}" for i in range(self.searchers))]


@dataclass
class Fault:
    """One fault as planned (kind, target) and as it went."""

    kind: str  # "kill", "redis unreachable", "checkpoint volume full"
    target: str
    at: float | None = None  # seconds into the run when it began
    ok: bool = False
    outcome: str = "not run"
    figures: dict[str, Any] = field(default_factory=dict)


@dataclass
class Check:
    """One pass criterion: whether it held, and the figures that say so."""

    ok: bool
    detail: str


@dataclass
class ChaosResult:
    """What a chaos run did (the faults, as they went) and found (the pass criteria), with tba up's summary."""

    config: ChaosConfig
    run_dir: Path
    faults: list[Fault]
    checks: dict[str, Check]
    summary: dict[str, Any]
    wall_seconds: float

    def problems(self) -> list[str]:
        """Every fault not recovered from and every criterion missed (empty: the run passed)."""
        return [f"{f.kind} of {f.target}: {f.outcome}" for f in self.faults if not f.ok] + [
            f"{name}: {c.detail}" for name, c in self.checks.items() if not c.ok
        ]

    @property
    def passed(self) -> bool:
        return not self.problems()


def plan(config: ChaosConfig, rng: random.Random) -> list[Fault]:
    """Every fault of the run, in a random order."""
    faults = [Fault("kill", part) for part in config.parts for _ in range(config.kills)]
    if config.outage_seconds > 0:
        faults.append(Fault("redis unreachable", "redis", figures={"seconds": config.outage_seconds}))
    if config.disk_full_seconds > 0:
        faults.append(Fault("checkpoint volume full", "trainer", figures={"seconds": config.disk_full_seconds}))
    rng.shuffle(faults)
    return faults


def start_time(pid: int) -> str:
    """When ``pid`` started (clock ticks after boot; "" once it is gone): tells a process from a later one
    that got the same pid."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (FileNotFoundError, IndexError):
        return ""


def wait_for(what: str, probe: Callable[[], T], timeout: float, poll: float = 0.25) -> T:
    """``probe()``'s first truthy value; TimeoutError naming ``what`` if none comes within ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"no {what} after {timeout:.0f} s")
        time.sleep(poll)


# --- watching the stream and the announcements ---------------------------------------------------------------


@dataclass
class Announcement:
    """A checkpoint announcement as the audit received it, and whether its checkpoint verified then."""

    t: float  # seconds into the run
    version: int
    content_hash: str
    error: str | None  # None: the checkpoint verified when the announcement arrived


class Audit:
    """Every group id that reaches the trajectory stream, and every checkpoint announcement, as they happen.

    Creates the audit consumer group first (the stream then keeps every entry: module docstring). Both
    readers reconnect whenever Redis goes away (killed, frozen) and go on where they were."""

    def __init__(self, redis_url: str, store: CheckpointStore, t0: float) -> None:
        self.redis_url = redis_url
        self.store = store
        self.t0 = t0
        self.keys = Keys(NAMESPACE)
        self.seen: set[str] = set()
        self.undecodable = 0
        self.announcements: list[Announcement] = []
        self.group_ready = threading.Event()
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._follow_stream, name="audit-stream", daemon=True),
            threading.Thread(target=self._follow_announcements, name="audit-announce", daemon=True),
        ]

    def start(self) -> Audit:
        for thread in self._threads:
            thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(10)

    def newest_version(self) -> int:
        return max((a.version for a in self.announcements), default=0)

    def _client(self) -> redis.Redis:
        return sync_client(self.redis_url, timeout=5)

    def _follow_stream(self) -> None:
        last = "0-0"
        while not self._stop.is_set():
            try:
                client = self._client()
                if not self.group_ready.is_set():
                    try:
                        client.xgroup_create(self.keys.trajectories, AUDIT_GROUP, id="0", mkstream=True)
                    except redis.ResponseError as err:
                        if "BUSYGROUP" not in str(err):
                            raise
                    self.group_ready.set()
                while not self._stop.is_set():
                    for _stream, entries in client.xread({self.keys.trajectories: last}, count=1000, block=1000):
                        for entry_id, fields in entries:
                            last = entry_id.decode()
                            self._record(fields.get(STREAM_FIELD.encode()))
            except (redis.RedisError, OSError):
                self._stop.wait(0.5)

    def _record(self, payload: bytes | None) -> None:
        try:
            self.seen.add(str(unpack(payload or b"")["group_id"]))
        except (ValueError, KeyError, TypeError):
            self.undecodable += 1

    def _follow_announcements(self) -> None:
        while not self._stop.is_set():
            try:
                pubsub = self._client().pubsub(ignore_subscribe_messages=True)
                pubsub.subscribe(self.keys.checkpoint_channel)
                while not self._stop.is_set():
                    message = pubsub.get_message(timeout=0.5)
                    if message and message["type"] == "message":
                        self._verify(message["data"])
            except (redis.RedisError, OSError):
                self._stop.wait(0.5)

    def _verify(self, data: bytes) -> None:
        manifest = parse_manifest(data)
        try:
            self.store.verify(manifest)
            error = None
        except CheckpointError as err:
            error = str(err)
        self.announcements.append(
            Announcement(round(time.time() - self.t0, 1), manifest.version, manifest.content_hash, error)
        )


# --- the system under test ----------------------------------------------------------------------------------


class System:
    """The ``tba up`` run, seen from outside: its summary, its processes, the status of its services."""

    def __init__(self, config: ChaosConfig, run_dir: Path) -> None:
        self.config = config
        self.run_dir = run_dir
        self.token = secrets.token_urlsafe(16)
        self.redis_password = secrets.token_urlsafe(16)
        self.proc: subprocess.Popen[bytes] | None = None
        self.t0 = 0.0
        self.seen: dict[int, str] = {}  # every process of the run ever seen (pid -> start time): none may outlive it
        self.http = httpx.Client(timeout=2.0, headers={"Authorization": f"Bearer {self.token}"})

    def redis_url(self) -> str:
        """The run's Redis, password included (the summary shows it redacted)."""
        endpoints = wait_for("running summary", lambda: self.summary().get("endpoints"), 120)
        return endpoints["redis"].replace("***", f":{self.redis_password}", 1)

    @property
    def store(self) -> CheckpointStore:
        return CheckpointStore(self.run_dir / "checkpoints")

    def start(self, base_model: Path) -> System:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        env = {
            **os.environ,
            "TBA_AUTH_TOKEN": self.token,
            "REDIS_PASSWORD": self.redis_password,
            "TBA_NAMESPACE": NAMESPACE,
            # Checkpoints stay on disk long enough to be verified when announced, and few enough to stay small.
            "TBA_CHECKPOINT_GRACE_SECONDS": "15",
            "TBA_KEEP_CHECKPOINTS": "3",
            # A paced searcher waits at most this long for a newer policy: while Redis is unreachable the
            # trainer, cut off from its samples, publishes nothing, and the searchers generate (and spill) anyway.
            "TBA_PACE_MAX_WAIT_SECONDS": "10",
        }
        cmd = tba_command(
            "up",
            no_console=True,
            searchers=self.config.searchers,
            placement="shared",  # paced searchers sharing the cores, as the scenario's waits assume
            minutes=self.config.minutes,
            run_dir=self.run_dir,
            base_model=base_model,
            eval_every=self.config.eval_every,
            eval_prompts=self.config.eval_prompts,
        )
        with (self.run_dir / "up.log").open("wb") as out:  # tba up's own lines
            self.proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
        self.t0 = time.time()
        return self

    def elapsed(self) -> float:
        return time.time() - self.t0

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def summary(self) -> dict[str, Any]:
        try:
            return json.loads((self.run_dir / "summary.json").read_text())
        except FileNotFoundError:
            return {}

    def service_pid(self, part: str) -> int | None:
        """Pid of the part's service (None while it is not running); notes every process of the run seen."""
        assert self.proc is not None
        for pid in descendants(self.proc.pid):
            self.seen.setdefault(pid, start_time(pid))
        return guarded_service(self.proc.pid, part)

    def status(self, part: str) -> dict[str, Any] | None:
        """The part's ``/status`` (trainer, searchers), or None while it does not answer."""
        url = self.summary().get("endpoints", {}).get(part)
        try:
            r = self.http.get(f"{url}/status")
            return r.json() if r.status_code == 200 else None
        except (httpx.HTTPError, ValueError):
            return None

    def left_running(self) -> list[str]:
        """Processes of the run still alive: those seen during it (the same pid and start time: pids are reused)
        and any whose command line or environment names the run directory."""
        left = [
            f"{pid} {command_line(pid)[:80]}"
            for pid, started in sorted(self.seen.items())
            if alive(pid) and start_time(pid) == started
        ]
        return left + running_with(str(self.run_dir))

    def searchers(self) -> list[str]:
        return [p for p in self.config.parts if p.startswith("searcher")]

    def stop(self) -> None:
        """End ``tba up`` if it still runs (SIGTERM: it stops in order; SIGKILL if it does not within 3 minutes)."""
        if self.running():
            assert self.proc is not None
            self.proc.terminate()
            try:
                self.proc.wait(180)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(30)
        self.http.close()


# --- the faults ---------------------------------------------------------------------------------------------


def kill(system: System, audit: Audit, fault: Fault) -> None:
    """SIGKILL of the part's service process; done once the supervisor has started it again."""
    part = fault.target
    pid = wait_for(f"running {part}", lambda: system.service_pid(part), RESTART_TIMEOUT)
    fault.figures.update(pid=pid, newest_announced=audit.newest_version())
    if part == "trainer":  # where its log stood: the restart's "resumed from" line comes after
        fault.figures["trainer_log_offset"] = (system.run_dir / "logs" / "trainer.log").stat().st_size
    fault.at = round(system.elapsed(), 1)
    os.kill(pid, signal.SIGKILL)
    killed = time.monotonic()
    try:
        wait_for(
            f"restarted {part}", lambda: (new := system.service_pid(part)) not in (None, pid) and new, RESTART_TIMEOUT
        )
    except TimeoutError as err:
        fault.outcome = str(err)
        return
    fault.figures["restart_s"] = round(time.monotonic() - killed, 1)
    fault.ok = True
    fault.outcome = f"restarted after {fault.figures['restart_s']} s"


def redis_unreachable(system: System, audit: Audit, fault: Fault) -> None:
    """redis-server frozen for a while: the searchers spill; afterwards every spill queue drains."""
    seconds = float(fault.figures["seconds"])
    pid = wait_for("running redis", lambda: system.service_pid("redis"), RESTART_TIMEOUT)
    # A searcher still loading its engine (restarted after a kill) generates nothing to spill: one generating is enough.
    wait_for(
        "a searcher generating",
        lambda: any((system.status(s) or {}).get("state") not in (None, "loading") for s in system.searchers()),
        RESTART_TIMEOUT,
    )
    before = {s: (system.status(s) or {}).get("spilled_total") for s in system.searchers()}
    fault.at = round(system.elapsed(), 1)
    os.kill(pid, signal.SIGSTOP)
    try:
        time.sleep(seconds)
        during = {s: system.status(s) or {} for s in system.searchers()}
    finally:
        os.kill(pid, signal.SIGCONT)
    resumed = time.monotonic()
    spilled = {
        s: during[s].get("spilled_total", 0) - (before[s] or 0)
        for s in during
        if before[s] is not None and during[s].get("spilled_total") is not None
    }
    fault.figures.update(spilled_groups=spilled, redis_down_seen=[s for s in during if during[s].get("redis_up") == 0])

    def drained() -> bool:
        statuses = [system.status(s) for s in system.searchers()]
        return all(st is not None and st.get("spilled") == 0 and st.get("redis_up") == 1 for st in statuses)

    try:
        wait_for("drained spill queues", drained, 120)
    except TimeoutError as err:
        fault.outcome = f"spilled {sum(spilled.values())} groups; {err}"
        return
    fault.figures["drained_after_s"] = round(time.monotonic() - resumed, 1)
    fault.ok = sum(spilled.values()) > 0
    each = ", ".join(f"{k} {v}" for k, v in spilled.items())
    fault.outcome = (
        f"searchers spilled {sum(spilled.values())} groups ({each}), every spill queue drained "
        f"{fault.figures['drained_after_s']} s after Redis came back"
    )
    if not fault.ok:
        fault.outcome = "no searcher spilled anything while Redis was unreachable (nothing generated?)"


def checkpoint_volume_full(system: System, audit: Audit, fault: Fault) -> None:
    """The trainer's checkpoint writes fail for a while: it says so, keeps its last good checkpoint, trains on,
    and publishes again once writes work."""
    seconds = float(fault.figures["seconds"])
    store = system.store
    pid = wait_for("running trainer", lambda: system.service_pid("trainer"), RESTART_TIMEOUT)
    before = wait_for("a published checkpoint", store.read_manifest, 120)
    log_path = system.run_dir / "logs" / "trainer.log"
    growing = [log_path, system.run_dir / "trainer_metrics.jsonl"]  # what the trainer appends to meanwhile
    logs = max(p.stat().st_size for p in growing if p.exists())
    largest = max(p.stat().st_size for p in store.verify(before).iterdir() if p.is_file())
    limit = logs + (4 << 20)
    if limit >= largest:
        fault.outcome = f"cannot simulate: the trainer's logs ({logs} bytes) are near its largest checkpoint file"
        return
    offset = log_path.stat().st_size
    step_before = (system.status("trainer") or {}).get("step")
    fault.at = round(system.elapsed(), 1)
    previous = resource.prlimit(pid, resource.RLIMIT_FSIZE, (limit, resource.prlimit(pid, resource.RLIMIT_FSIZE)[1]))
    try:
        time.sleep(seconds)
        kept = store.read_manifest()
        step_after = (system.status("trainer") or {}).get("step")
    finally:
        try:
            resource.prlimit(pid, resource.RLIMIT_FSIZE, previous)
        except ProcessLookupError:
            pass
    lifted = time.monotonic()
    with log_path.open("rb") as f:
        f.seek(offset)
        said = [line for line in f.read().decode(errors="replace").splitlines() if "could not write checkpoint" in line]
    try:
        kept_ok = kept is not None and store.verify(kept) is not None
    except CheckpointError:
        kept_ok = False
    # The reason closes each line's parenthesis: "File too large (os error 27)" from safetensors, torch's own words.
    reasons = Counter(line.rsplit(": ", 1)[-1].split(");")[0] for line in said)
    fault.figures.update(
        limit_bytes=limit,
        largest_file_bytes=largest,
        failed_writes=len(said),
        reasons=dict(reasons),
        kept=kept and kept.version,
        steps_meanwhile=(step_after or 0) - (step_before or 0),
    )
    try:
        wait_for(
            "a checkpoint published after the volume had room again",
            lambda: audit.newest_version() > (kept.version if kept else 0),
            120,
        )
    except TimeoutError as err:
        fault.outcome = f"{len(said)} failed writes; {err}"
        return
    fault.figures["published_again_after_s"] = round(time.monotonic() - lifted, 1)
    fault.ok, fault.outcome = disk_full_verdict(fault.figures, reasons, kept_ok)


def disk_full_verdict(figures: dict[str, Any], reasons: Counter[str], kept_ok: bool) -> tuple[bool, str]:
    """Whether the full-disk fault was survived, and how, from what was measured. A trainer that logged no
    failed write fails this criterion (the fault did not bite, or its log lines changed wording), with that
    said, instead of ending the run (``python -m doctest reliability/chaos.py`` checks these examples):

    >>> figures = {"failed_writes": 3, "steps_meanwhile": 12, "kept": 7, "published_again_after_s": 4.2}
    >>> ok, outcome = disk_full_verdict(figures, Counter({"File too large (os error 27)": 3}), kept_ok=True)
    >>> ok, outcome.split("; ")[1:]
    (True, ['v7 stayed LATEST and verified', 'next checkpoint 4.2 s after the writes worked again'])
    >>> outcome.split("; ")[0]
    'trainer logged 3 failed checkpoint writes (e.g. "File too large (os error 27)") and trained on (12 steps)'
    >>> ok, outcome = disk_full_verdict({**figures, "failed_writes": 0}, Counter(), kept_ok=True)
    >>> ok, outcome.split(" and ")[0]
    (False, 'trainer logged 0 failed checkpoint writes (no reason found in its log)')
    >>> ok, outcome = disk_full_verdict(figures, Counter({"EFBIG": 3}), kept_ok=False)
    >>> ok, "v7 stayed LATEST and did NOT verify" in outcome
    (False, True)
    """
    failed = figures["failed_writes"]
    said = f'e.g. "{reasons.most_common(1)[0][0]}"' if reasons else "no reason found in its log"
    ok = failed > 0 and kept_ok and figures["steps_meanwhile"] > 0
    return ok, (
        f"trainer logged {failed} failed checkpoint writes ({said}) and trained on "
        f"({figures['steps_meanwhile']} steps); v{figures['kept']} stayed LATEST and "
        f"{'verified' if kept_ok else 'did NOT verify'}; next checkpoint "
        f"{figures['published_again_after_s']} s after the writes worked again"
    )


FAULTS: dict[str, Callable[[System, Audit, Fault], None]] = {
    "kill": kill,
    "redis unreachable": redis_unreachable,
    "checkpoint volume full": checkpoint_volume_full,
}


# --- after the run: what Redis kept ---------------------------------------------------------------------------


@dataclass
class Kept:
    """What the run's Redis holds after the run, read from a copy of its AOF."""

    stream_ids: list[str]  # group id of every stream entry, in order (a resent group appears twice)
    entries_added: int
    stored_ids: set[str]
    stats: dict[str, int]
    pending: int
    undelivered: int


def read_kept(redis_dir: Path) -> Kept:
    """Start a redis-server of our own on a copy of the run's data directory and read the stream and the store."""
    with tempfile.TemporaryDirectory(prefix="chaos-redis-") as tmp:
        copy = Path(tmp) / "redis"
        shutil.copytree(redis_dir, copy)
        server = RedisServer(copy).start()
        try:
            client = sync_client(server.url)
            keys = Keys(NAMESPACE)
            ids: list[str] = []
            start = "-"
            while True:
                entries = client.xrange(keys.trajectories, min=start, count=2000)
                for _entry_id, fields in entries:
                    ids.append(str(unpack(fields[STREAM_FIELD.encode()])["group_id"]))
                if len(entries) < 2000:
                    break
                start = "(" + entries[-1][0].decode()
            info = client.xinfo_stream(keys.trajectories)
            groups = {g["name"].decode(): g for g in client.xinfo_groups(keys.trajectories)}
            buffer_group = groups.get(keys.ingest_group, {})
            stats = {k.decode(): int(float(v)) for k, v in client.hgetall(keys.global_key("stats")).items()}
            return Kept(
                stream_ids=ids,
                entries_added=int(info["entries-added"]),
                stored_ids={m.decode() for m in client.zrange(keys.global_key("groups"), 0, -1)},
                stats=stats,
                pending=int(buffer_group.get("pending", -1)),
                undelivered=int(buffer_group.get("lag") or 0),
            )
        finally:
            server.stop()


# --- the checks -----------------------------------------------------------------------------------------------


def check_published_stored(kept: Kept, audit: Audit, run_dir: Path) -> Check:
    published = set(kept.stream_ids) | audit.seen
    stored = kept.stored_ids
    lost_by_redis = audit.seen - set(kept.stream_ids)
    resent = len(kept.stream_ids) - len(set(kept.stream_ids))
    spilled = sorted(str(p.relative_to(run_dir)) for p in (run_dir / "spill").glob("*/*.msgpack"))
    bad = sorted(str(p.relative_to(run_dir)) for p in (run_dir / "spill").glob("*/bad/*"))
    s = kept.stats
    problems = []
    if published != stored:
        problems.append(
            f"{len(published - stored)} published but not stored, {len(stored - published)} stored but "
            f"never published (e.g. {sorted(published ^ stored)[:3]})"
        )
    if lost_by_redis:
        problems.append(f"{len(lost_by_redis)} seen on the stream during the run but missing from its AOF")
    if kept.entries_added != len(kept.stream_ids):
        problems.append(
            f"the stream was trimmed ({kept.entries_added} entries added, {len(kept.stream_ids)} kept): "
            "the audit group came too late, the count is incomplete"
        )
    # A counter the buffer never incremented is absent from its hash: 0.
    ingested, duplicate, dead = (s.get(name, 0) for name in ("groups_ingested", "groups_duplicate", "dead_letters"))
    if ingested != len(kept.stream_ids) or duplicate != resent:
        problems.append(
            f"ingested {ingested} of {len(kept.stream_ids)} entries, {duplicate} counted duplicate of {resent} resent"
        )
    if dead or kept.pending or kept.undelivered:
        problems.append(f"{dead} dead letters, {kept.pending} pending, {kept.undelivered} never read")
    if spilled or bad or audit.undecodable:
        problems.append(
            f"left in spill queues: {spilled[:3]} ({len(spilled)}), quarantined: {bad[:3]}, "
            f"undecodable entries: {audit.undecodable}"
        )
    detail = (
        f"{len(published)} group ids published, {len(stored)} stored; {len(kept.stream_ids)} stream entries "
        f"({resent} resent, stored once); {dead} dead letters; spill queues empty"
    )
    return Check(not problems, "; ".join(problems) if problems else detail)


def check_versions(audit: Audit) -> Check:
    announced = audit.announcements
    problems = [f"v{a.version} at {a.t} s: {a.error}" for a in announced if a.error]
    hashes: dict[int, str] = {}
    for prev, cur in zip(announced, announced[1:], strict=False):
        if cur.version < prev.version:
            problems.append(f"v{cur.version} announced at {cur.t} s after v{prev.version}")
    for a in announced:
        if hashes.setdefault(a.version, a.content_hash) != a.content_hash:
            problems.append(f"v{a.version} announced for two different checkpoints")
    if len({a.version for a in announced}) < 3:
        problems.append(f"only {len(announced)} announcements")
    versions = [a.version for a in announced]
    detail = (
        f"{len(announced)} announcements of {len(set(versions))} versions "
        f"(v{min(versions, default=0)} to v{max(versions, default=0)}), each verified complete on arrival"
    )
    return Check(not problems, "; ".join(problems[:5]) if problems else detail)


def check_trainer_resumes(faults: list[Fault], run_dir: Path) -> Check:
    text = (run_dir / "logs" / "trainer.log").read_bytes()
    line = rb"resumed from step-\d+: step \d+, version (\d+)"
    resumed = [(m.start(), int(m.group(1))) for m in re.finditer(line, text)]
    kills = [f for f in faults if f.kind == "kill" and f.target == "trainer" and f.ok]
    problems, figures = [], []
    for f in kills:
        after = next((v for pos, v in resumed if pos >= f.figures["trainer_log_offset"]), None)
        newest = f.figures["newest_announced"]
        figures.append(f"v{after} (newest announced before the kill: v{newest})")
        if after is None or after < newest:
            problems.append(f"kill at {f.at} s: resumed from {after}, newest announced v{newest}")
    if not kills:
        problems.append("the trainer was never killed")
    return Check(not problems, "; ".join(problems) if problems else "resumed from " + ", ".join(figures))


def check_nothing_left(system: System) -> Check:
    left = system.left_running()
    detail = f"0 of the {len(system.seen)} processes seen during the run alive after it"
    return Check(not left, f"still running: {left[:5]}" if left else detail)


def check_accuracy(summary: dict[str, Any]) -> Check:
    evals = summary.get("evaluations") or []
    if len(evals) < 2:
        return Check(False, f"only {len(evals)} evaluations")
    start, end = evals[0], evals[-1]
    detail = f"{start['accuracy']:.1%} (v{start['version']}) -> {end['accuracy']:.1%} (v{end['version']})"
    return Check(end["accuracy"] > start["accuracy"], detail)


def calm(system: System, audit: Audit) -> Check:
    """Once every part is back, each searcher must reach the version newest at that moment."""

    def every_part_back() -> bool:
        statuses = [system.status(p) for p in [*system.searchers(), "trainer"]]
        return all(system.service_pid(p) for p in system.config.parts) and all(
            st is not None and st.get("state") not in (None, "starting", "loading") for st in statuses
        )

    deadline = system.t0 + system.config.minutes * 60 - 5
    try:
        wait_for("every part running", every_part_back, max(1.0, deadline - time.time()))
    except TimeoutError as err:
        return Check(False, str(err))
    newest = audit.newest_version()
    started = time.monotonic()
    reached: dict[str, float] = {}
    while time.time() < deadline and len(reached) < len(system.searchers()):
        for s in system.searchers():
            if s not in reached and ((system.status(s) or {}).get("version") or 0) >= newest:
                reached[s] = round(time.monotonic() - started, 1)
        time.sleep(0.5)
    missing = [s for s in system.searchers() if s not in reached]
    detail = ", ".join(f"{s} in {t} s" for s, t in reached.items())
    if missing:
        return Check(False, f"v{newest} not reached by {missing} before the end ({detail})")
    return Check(True, f"v{newest} (newest once every part was back) reached by {detail}")


# --- the run ------------------------------------------------------------------------------------------------


def progress(line: str) -> None:
    print(line, flush=True)


def run_chaos(config: ChaosConfig, run_dir: Path, say: Callable[[str], None] = progress) -> ChaosResult:
    """One chaos run (module docstring); returns what was done and what was checked."""
    from tba.model.sft import ensure_base_model

    started = time.monotonic()
    rng = random.Random(config.seed)
    faults = plan(config, rng)
    base_model = config.base_model or ensure_base_model()
    system = System(config, run_dir).start(base_model)
    audit: Audit | None = None
    checks: dict[str, Check] = {}
    try:
        audit = Audit(system.redis_url(), system.store, system.t0).start()
        if not audit.group_ready.wait(30):
            raise RuntimeError("could not put the audit group on the stream")
        wait_for("first checkpoint", lambda: audit.newest_version() > 0 or not system.running(), 900)
        say(f"[{system.elapsed():5.0f} s] first checkpoint v{audit.newest_version()}; {len(faults)} faults to go")
        end_of_faults = system.t0 + config.minutes * 60 - config.calm_seconds
        for i, fault in enumerate(faults):
            if not system.running():
                break
            busy = sum(float(f.figures.get("seconds", 0)) + FAULT_OVERHEAD_SECONDS for f in faults[i:])
            pause = max(0.0, (end_of_faults - time.time() - busy) / (len(faults) - i + 1))
            time.sleep(rng.uniform(0, 2 * pause))
            FAULTS[fault.kind](system, audit, fault)
            say(f"[{system.elapsed():5.0f} s] {fault.kind} {fault.target}: {fault.outcome}")
        checks["searchers_on_newest"] = calm(system, audit)
        say(f"[{system.elapsed():5.0f} s] calm: {checks['searchers_on_newest'].detail}")
        assert system.proc is not None
        try:
            system.proc.wait(timeout=max(60.0, system.t0 + config.minutes * 60 + 300 - time.time()))
        except subprocess.TimeoutExpired:
            say("tba up did not end in time: stopping it")
    finally:
        if audit is not None:
            audit.stop()
        system.stop()
    assert system.proc is not None and audit is not None
    summary = system.summary()
    checks["clean_exit"] = Check(
        system.proc.returncode == 0 and summary.get("state") == "complete",
        f"tba up exited with {system.proc.returncode}, summary state {summary.get('state')}",
    )
    deadline = time.monotonic() + 15  # the guards' grace period, and then some
    while time.monotonic() < deadline and system.left_running():
        time.sleep(0.5)
    checks["nothing_left_behind"] = check_nothing_left(system)
    checks["published_equals_stored"] = check_published_stored(read_kept(run_dir / "redis"), audit, run_dir)
    checks["versions_increase"] = check_versions(audit)
    checks["trainer_resumes"] = check_trainer_resumes(faults, run_dir)
    checks["accuracy_improves"] = check_accuracy(summary)
    return ChaosResult(config, run_dir, faults, checks, summary, round(time.monotonic() - started, 1))


# --- the report -----------------------------------------------------------------------------------------------

CRITERIA = {
    "published_equals_stored": "published = stored, by group id",
    "versions_increase": "versions strictly increase, every announced checkpoint complete",
    "trainer_resumes": "the trainer resumes from its newest checkpoint",
    "searchers_on_newest": "the searchers end on the newest version",
    "nothing_left_behind": "no process left behind after the run",
    "accuracy_improves": "held-out accuracy still improves",
    "clean_exit": "tba up ends cleanly (exit 0, summary complete)",
}


def markdown(result: ChaosResult) -> str:
    c, s = result.config, result.summary
    rows = []
    by_kind: dict[tuple[str, str], list[Fault]] = {}
    for f in sorted(result.faults, key=lambda f: (f.kind != "kill", c.parts.index(f.target), f.kind)):
        by_kind.setdefault((f.kind, f.target), []).append(f)
    for (kind, target), faults in by_kind.items():
        ok = sum(f.ok for f in faults)
        if kind == "kill":
            restarts = ", ".join(str(f.figures.get("restart_s")) for f in faults if f.ok)
            what = f"SIGKILL of {target}"
            outcome = f"restarted {ok}/{len(faults)}"
            moments = ", ".join(f"{f.at} s" if f.at is not None else "not run" for f in faults)
            figures = f"at {moments} into the run; restarted after {restarts or '-'} s"
        else:
            what = f"{kind} ({faults[0].figures['seconds']:.0f} s)"
            outcome = f"{'recovered' if ok == len(faults) else 'FAILED'}"
            figures = "; ".join(f"at {f.at} s: {f.outcome}" if f.at is not None else f.outcome for f in faults)
        rows.append([what, len(faults), outcome, figures])
    checks = [[CRITERIA[k], "pass" if v.ok else "**FAIL**", v.detail] for k, v in result.checks.items()]
    return (
        f"One `tba up` run of {c.minutes:g} minutes ({c.searchers} searchers, seed {c.seed}): the faults at random "
        f"moments from the trainer's first checkpoint on, then {c.calm_seconds:.0f} s without faults. Trainer steps: "
        f"{s.get('trainer_steps')}, versions published: {len(s.get('versions_published') or [])}, restarts: "
        f"{s.get('restarts')}. How each fault is made and each criterion counted: `reliability/chaos.py`.\n\n"
        f"**{'All criteria passed' if result.passed else 'FAILED'}** ({result.wall_seconds:.0f} s in all).\n\n"
        + table(["fault", "times", "outcome", "figures"], rows)
        + "\n"
        + table(["pass criterion", "result", "figures"], checks)
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m reliability.chaos", description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=ChaosConfig.minutes, help="Length of the run.")
    parser.add_argument("--kills", type=int, default=ChaosConfig.kills, help="SIGKILLs of each part.")
    parser.add_argument("--seed", type=int, default=ChaosConfig.seed, help="Order and moments of the faults.")
    parser.add_argument(
        "--outage", type=float, default=ChaosConfig.outage_seconds, help="Seconds Redis is unreachable (0: not tried)."
    )
    parser.add_argument(
        "--disk-full",
        type=float,
        default=ChaosConfig.disk_full_seconds,
        help="Seconds the checkpoint volume is full (0: not tried).",
    )
    parser.add_argument(
        "--calm", type=float, default=ChaosConfig.calm_seconds, help="Seconds without faults at the end."
    )
    parser.add_argument(
        "--eval-every", type=float, default=ChaosConfig.eval_every, help="Seconds between held-out evaluations."
    )
    parser.add_argument(
        "--eval-prompts", type=int, default=ChaosConfig.eval_prompts, help="Held-out prompts per evaluation."
    )
    parser.add_argument("--base-model", type=Path, default=None, help="Base model (default: the cached SFT base).")
    parser.add_argument("--run-dir", type=Path, default=None, help="Run directory (default runs/chaos-<timestamp>).")
    parser.add_argument("--no-report", action="store_true", help="Do not write the chaos section of RELIABILITY.md.")
    parser.add_argument("--result", type=Path, default=None, help="Also write what the run found as JSON here.")
    args = parser.parse_args(argv)
    config = ChaosConfig(
        minutes=args.minutes,
        kills=args.kills,
        seed=args.seed,
        outage_seconds=args.outage,
        disk_full_seconds=args.disk_full,
        calm_seconds=args.calm,
        eval_every=args.eval_every,
        eval_prompts=args.eval_prompts,
        base_model=args.base_model,
    )
    run_dir = (args.run_dir or ROOT / "runs" / time.strftime("chaos-%Y%m%d-%H%M%S")).resolve()
    result = run_chaos(config, run_dir)
    print(f"chaos: run directory {run_dir}")
    if args.result:
        write_result(args.result, result, result.problems(), parts=config.parts)
    return finish(
        "chaos", markdown(result), result.problems(), sys.argv[1:] if argv is None else argv, write=not args.no_report
    )


if __name__ == "__main__":
    sys.exit(main())
