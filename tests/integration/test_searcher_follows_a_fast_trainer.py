"""A slow searcher beside a fast trainer, as processes: `tba searcher` (real vLLM CPU engine) against a real
redis-server, and a trainer's publishing loop (the trainer's own store calls: commit, announce, prune) that
publishes a real checkpoint every 50 ms with the smallest retention (one kept, one on disk, no grace). Each
time the searcher takes a lease on a checkpoint (it is about to verify and then load it) the whole searcher,
engine included, is stopped with SIGSTOP for two seconds, then let run for two.

While the trainer honours the searchers' leases, the searcher loses nothing it started to read (no
checkpoint vanishes under its lease, no reload fails), is never more than the staleness bound behind for
longer than TBA_LAG_SECONDS (measured from outside, against what was announced), its watcher never dies and
it never falls back to the base model. Then the same run goes on with the trainer ignoring the leases, and
the same check fails: the searcher loses what it was loading (and, when the weights it served are pruned
too while a reload fails half-way, stops rather than generate with mixed weights).
"""

from __future__ import annotations

import bisect
import os
import re
import signal
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tba.checkpoint_leases import SEPARATOR, CheckpointLeases
from tba.checkpoints import CheckpointStore, announce
from tba.health import free_port
from tba.keys import Keys
from tba.local.commands import tba_command
from tba.local.lifetime import guard_command

pytestmark = [pytest.mark.slow, pytest.mark.vllm]

KEYS = Keys("fast")
SEARCHER = "slow-0"
BOUND = 16  # TBA_MAX_STALENESS of this run: ~1 s of this trainer's publishing
LAG_SECONDS = 8.0  # TBA_LAG_SECONDS of this run
PAUSE_SECONDS, RUN_SECONDS = 2.0, 2.0  # each stop of the searcher, and how long it runs before the next may come
HONOURED_SECONDS, IGNORED_SECONDS = 20.0, 12.0


class FastTrainer(threading.Thread):
    """Publishes a checkpoint of the tiny model every ``interval`` seconds, then prunes as the trainer does
    (services/trainer/loop.py, ``Trainer.prune``), with the searchers' leases while ``honour`` is set."""

    def __init__(self, store: CheckpointStore, client, model: Path, honour: threading.Event, interval: float = 0.05):
        super().__init__(name="fast-trainer", daemon=True)
        self.store, self.client, self.model, self.honour, self.interval = store, client, model, honour, interval
        self.leases = CheckpointLeases(client, KEYS)
        self.announced: list[tuple[float, int]] = []  # (monotonic time, version)
        self.stop = threading.Event()
        self.error: BaseException | None = None

    def newest_at(self, t: float) -> int:
        i = bisect.bisect_right([a for a, _ in self.announced], t)
        return self.announced[i - 1][1] if i else 0

    def run(self) -> None:
        version = 0
        try:
            while not self.stop.wait(self.interval):
                version += 1
                tmp = self.store.new_tmp_dir()
                for path in self.model.iterdir():
                    if path.is_file():
                        os.link(path, tmp / path.name)  # a checkpoint's files, without copying 14 MB each time
                manifest = self.store.commit(tmp, version=version, step=version, durable=False)
                announce(self.client, KEYS, manifest)
                self.announced.append((time.monotonic(), version))
                leases = self.leases if self.honour.is_set() else None
                self.store.prune(keep=1, grace_seconds=0.0, max_on_disk=1, leases=leases)
        except BaseException as err:  # noqa: BLE001 (reported by the test)
            self.error = err


class Pauser(threading.Thread):
    """Stops the searcher's process group for PAUSE_SECONDS whenever it takes a lease on a checkpoint it has not
    held before (it is verifying that checkpoint, and will load it), at most once per RUN_SECONDS of running."""

    def __init__(self, client, pgid: int) -> None:
        super().__init__(name="pauser", daemon=True)
        self.client, self.pgid = client, pgid
        self.paused = threading.Event()
        self.pauses = 0
        self.stop = threading.Event()

    def leased(self) -> set[str]:
        members = self.client.zrange(KEYS.checkpoint_leases, 0, -1)
        return {m.decode().rpartition(SEPARATOR)[2] for m in members if m.decode().startswith(f"{SEARCHER}:")}

    def run(self) -> None:
        seen = self.leased()
        next_allowed = 0.0
        while not self.stop.wait(0.005):
            new = self.leased() - seen
            seen |= new
            if new and time.monotonic() >= next_allowed:
                self.paused.set()
                os.killpg(self.pgid, signal.SIGSTOP)
                try:
                    self.stop.wait(PAUSE_SECONDS)
                finally:
                    os.killpg(self.pgid, signal.SIGCONT)
                    self.paused.clear()
                self.pauses += 1
                next_allowed = time.monotonic() + RUN_SECONDS


@dataclass(frozen=True)
class Seen:
    t: float  # monotonic
    status: dict
    ready: int  # /readyz answer


def observe(base: str, pauser: Pauser, seconds: float) -> list[Seen]:
    """The searcher's /status and /readyz every 0.2 s while it runs (a stopped one cannot answer)."""
    seen: list[Seen] = []
    deadline = time.monotonic() + seconds
    with httpx.Client(timeout=1.0) as http:
        while time.monotonic() < deadline:
            if not pauser.paused.is_set():
                try:
                    status, ready = http.get(f"{base}/status").json(), http.get(f"{base}/readyz").status_code
                    seen.append(Seen(time.monotonic(), status, ready))
                except httpx.HTTPError:
                    pass  # stopped between the check and the request
            time.sleep(0.2)
    return seen


def longest_over_bound(seen: list[Seen], trainer: FastTrainer) -> float:
    """The longest stretch the served version stayed more than BOUND behind the newest announced: from the first
    observation over the bound to the next one within it (or the last observation)."""
    longest, since = 0.0, None
    for s in seen:
        over = trainer.newest_at(s.t) - s.status["version"] > BOUND
        if over and since is None:
            since = s.t
        if since is not None:
            longest = max(longest, s.t - since)
            if not over:
                since = None
    return longest


def check_follows(seen: list[Seen], trainer: FastTrainer, before: dict) -> None:
    """What the searcher promises beside any trainer: it loses nothing it started to read, is never more than the
    bound behind for longer than TBA_LAG_SECONDS, its watcher never dies, and it never goes back to the base."""
    assert seen, "the searcher answered nothing: it exited"
    last = seen[-1].status
    lost = last["lost_checkpoints"] - before["lost_checkpoints"]
    failed = last["reload_failures"] - before["reload_failures"]
    assert lost == 0 and failed == 0, f"lost {lost} checkpoints under a lease, {failed} reloads failed"
    longest = longest_over_bound(seen, trainer)
    assert longest <= LAG_SECONDS, f"{longest:.1f} s more than {BOUND} versions behind"
    assert all(s.status["watcher_alive"] == 1 for s in seen) and last["watcher_errors"] == 0
    versions = [s.status["version"] for s in seen]
    assert versions == sorted(versions) and versions[-1] > before["version"] > 0, "went back, or never moved on"


def test_a_slowed_searcher_loses_nothing_and_keeps_up_only_while_leases_are_honoured(
    redis_server, tiny_model: Path, tmp_path: Path
) -> None:
    store = CheckpointStore(tmp_path / "ckpt")
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    env = {
        **os.environ,
        "TBA_MODEL": str(tiny_model),
        "TBA_REDIS_URL": redis_server.url,
        "TBA_NAMESPACE": KEYS.ns,
        "TBA_CHECKPOINT_DIR": str(store.root),
        "TBA_SPILL_DIR": str(tmp_path / "spill"),
        "TBA_METRICS_PORT": str(port),
        "TBA_SEARCHER_ID": SEARCHER,
        "TBA_REF_PASS": "trainer",  # generation and rewards only: the reference pass is not what is tested
        "TBA_PROMPTS_PER_BATCH": "4",
        "TBA_COMPLETIONS_PER_PROMPT": "4",
        "TBA_MAX_NEW_TOKENS": "8",
        "TBA_MAX_MODEL_LEN": "64",
        "TBA_RELOAD_POLL_SECONDS": "0.5",
        "TBA_MAX_STALENESS": str(BOUND),
        "TBA_LAG_SECONDS": str(LAG_SECONDS),
        "TBA_CHECKPOINT_LEASE_SECONDS": "30",
    }
    log = tmp_path / "searcher.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(  # under a guard: nothing of it outlives this test, even killed
            guard_command(tba_command("searcher"), SEARCHER, grace=10.0),
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    client = redis_server.client()
    honour = threading.Event()
    honour.set()
    trainer = FastTrainer(store, client, tiny_model, honour)
    pauser = Pauser(client, proc.pid)
    try:
        deadline = time.monotonic() + 300
        while not _ready(base):
            assert proc.poll() is None, f"the searcher exited:\n{log.read_text()[-3000:]}"
            assert time.monotonic() < deadline, f"the searcher is not ready:\n{log.read_text()[-3000:]}"
            time.sleep(0.5)
        trainer.start()
        pauser.start()
        # 1. The trainer honours the leases: the searcher follows, however it is slowed. (Measured once it has
        # reloaded twice: its first batch takes vLLM's warm-up.)
        start = _status(base)
        while not (start and start["reloads"] >= 2):
            assert proc.poll() is None and time.monotonic() < deadline, f"no reloads:\n{log.read_text()[-3000:]}"
            time.sleep(0.5)
            start = _status(base)
        honoured = observe(base, pauser, HONOURED_SECONDS)
        assert pauser.pauses >= 3, "the searcher was not slowed"
        check_follows(honoured, trainer, start)
        assert honoured[-1].status["reloads"] - start["reloads"] >= 3
        assert all(s.status["lagging"] == 0 for s in honoured)
        # 2. The same run, the leases ignored: what the searcher was loading is pruned under it.
        honour.clear()
        before = honoured[-1].status
        ignored = observe(base, pauser, IGNORED_SECONDS)
        with pytest.raises(AssertionError):
            check_follows(ignored, trainer, before)
        # What failed: checkpoints vanished under its leases and its reloads failed; where the weights it served
        # were pruned too, a reload that failed half-way could not load them back, and it stopped rather than
        # generate with mixed weights (or with the base model's).
        last = ignored[-1].status if ignored else before
        losses = (
            last["lost_checkpoints"] + last["reload_failures"] - before["lost_checkpoints"] - before["reload_failures"]
        )
        assert losses > 0 or "could not be loaded back" in log.read_text()
        assert all(s.status["version"] >= before["version"] > 0 for s in ignored)  # never back to v0
        assert trainer.error is None
    finally:
        pauser.stop.set()
        trainer.stop.set()
        pauser.join(10)
        trainer.join(10)
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGCONT)
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                pass
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
    text = log.read_text()
    assert re.search(r"reloaded v\d+ -> v\d+ in place", text)
    # The float32 master weights cast into the engine's dtype at every reload: vLLM's warning about it is silenced.
    assert "Attempted to load weight" not in text


def _status(base: str) -> dict | None:
    try:
        return httpx.get(f"{base}/status", timeout=1).json()
    except httpx.HTTPError:
        return None  # stopped by the pauser


def _ready(base: str) -> bool:
    try:
        return httpx.get(f"{base}/readyz", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False
