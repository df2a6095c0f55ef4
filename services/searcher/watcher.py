"""The checkpoint watcher: learns of new policy versions and verifies them off the generation path.

Three sources, newest version wins: the Redis announcement (pub/sub, instant),
the Redis key holding the newest manifest, and the checkpoint root's ``LATEST``
file (both polled every ``reload_poll_seconds``, and at once after a
reconnect, so a searcher that started late or missed a message catches up).
A background thread leases the candidate (:mod:`services.searcher.leases`: the
trainer prunes no checkpoint a searcher holds) and hashes it
(``CheckpointStore.verify``) while generation goes on; the loop only ever sees
checkpoints that verified, and :meth:`take` hands it the newest one, skipping
any older that arrived in between. A checkpoint whose hash does not match is
refused for good. One that is gone before the watcher got to it (pruned, its
lease refused) is skipped for the newest announced; the newest itself, when
missing, is retried (shared storage may show it late).

The thread cannot die: whatever one pass of it raises (an I/O error, a manifest
that does not parse, Redis going away) is logged and counted (``errors``), and
the thread goes on after a backoff.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import redis

from services.searcher.lag import VersionLag
from services.searcher.leases import Lease, LeaseKeeper
from tba.checkpoint_leases import CheckpointLeases
from tba.checkpoints import CheckpointError, CheckpointStore, parse_manifest
from tba.codec import PayloadError
from tba.keys import Keys
from tba.retry import backoff_delays
from tba.schemas import CheckpointManifest

log = logging.getLogger(__name__)
LEASE_SECONDS = 60.0  # a lease's length unless the searcher's settings say otherwise


@dataclass(frozen=True)
class VerifiedCheckpoint:
    manifest: CheckpointManifest
    path: Path

    @property
    def version(self) -> int:
        return self.manifest.version


class CheckpointWatcher:
    def __init__(
        self,
        client_factory: Callable[[], redis.Redis],
        keys: Keys,
        store: CheckpointStore,
        poll_seconds: float,
        current_version: int = 0,
        *,
        holder: str = "searcher",
        lease_seconds: float = LEASE_SECONDS,
        lag: VersionLag | None = None,
    ) -> None:
        self._client_factory = client_factory
        self.keys = keys
        self.store = store
        self.poll_seconds = poll_seconds
        self.current_version = current_version  # written by the loop after each reload
        self.rejected = 0
        self.newest_seen = current_version
        self.lag = lag or VersionLag(None, 0.0, time.monotonic)
        self.lag.serving(current_version)
        self.leases = LeaseKeeper(lambda: CheckpointLeases(client_factory(), keys), holder, lease_seconds)
        self.errors = 0  # exceptions a pass of the watcher raised (each logged; the watcher went on)
        self.last_error: str | None = None
        self.vanished = 0  # checkpoints gone before the watcher got to them
        self.lost = 0  # checkpoints gone while it held a lease on them (the trainer did not honour it)
        self._newest: CheckpointManifest | None = None  # the newest manifest heard of, from any source
        self._rejected: set[tuple[int, str]] = set()
        self._missing_logged: set[int] = set()
        self._ready: VerifiedCheckpoint | None = None
        self._ready_event = threading.Event()  # set while a verified checkpoint waits to be taken
        self._recheck = threading.Event()  # the loop refused one: look at the newest announced again
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._client: redis.Redis | None = None
        self._pubsub = None
        self._next_subscribe = self._next_poll = 0.0
        self._subscribe_delays = backoff_delays()

    # --- used by the loop ---
    def take(self) -> VerifiedCheckpoint | None:
        """The newest verified checkpoint newer than ``current_version``, once; None if there is none."""
        with self._lock:
            ready, self._ready = self._ready, None
            self._ready_event.clear()
        if ready is not None and ready.version <= self.current_version:
            self.leases.release(ready.manifest.path)
            return None
        return ready

    def wait_ready(self, timeout: float) -> bool:
        """Block until a verified checkpoint waits to be taken (True) or ``timeout`` passes (False): a paced
        searcher starts on a new policy the moment it is verified, not at its next look."""
        return self._ready_event.wait(timeout)

    @property
    def ready_version(self) -> int | None:
        ready = self._ready
        return ready.version if ready is not None else None

    def loaded(self, ckpt: VerifiedCheckpoint, previous: Path) -> None:
        """The engine now serves ``ckpt``: its lease stays (a failed reload loads it back), the lease of the
        weights it served before (``previous``) goes."""
        self.current_version = ckpt.version
        self.lag.serving(ckpt.version)
        if previous.parent == self.store.root and previous.name != ckpt.manifest.path:
            self.leases.release(previous.name)

    def poll_once(self) -> None:
        """Read the manifest key and the LATEST file now (start-up, and the periodic fallback). Never raises:
        what a source fails with is logged and counted, and the other source is still read."""
        for source, read in (("redis key", self._read_key), ("LATEST file", self.store.read_manifest)):
            try:
                manifest = read()
            except (redis.RedisError, PayloadError, OSError) as err:
                if isinstance(err, redis.RedisError):
                    self._client = None  # a new connection next time
                log.debug("cannot read the manifest from the %s: %s", source, err)
                continue
            if manifest is None:
                continue
            try:
                self.consider(manifest, source)
            except Exception as err:  # noqa: BLE001 (counted and logged; the watcher goes on)
                self._failed(err, f"checking v{manifest.version} from the {source}")

    def consider(self, manifest: CheckpointManifest, source: str) -> None:
        """Verify ``manifest`` if it is newer than anything loaded or ready; keep it if it verifies."""
        self._heard(manifest)
        newest = max(self.current_version, self.ready_version or -1)
        if manifest.version <= newest or (manifest.version, manifest.content_hash) in self._rejected:
            return
        try:
            directory = self.store.resolve(manifest)
        except CheckpointError as err:
            self._refuse(manifest, source, str(err))
            return
        lease = self.leases.acquire(directory.name)
        if lease is Lease.PRUNING or not directory.is_dir():
            self.leases.release(directory.name)
            self._gone(manifest, source, "the trainer is pruning it" if lease is Lease.PRUNING else "no directory")
            return
        try:
            path = self.store.verify(manifest)
        except (CheckpointError, OSError) as err:
            self.leases.release(directory.name)
            if not directory.is_dir():
                if lease is Lease.HELD:  # it was there when the lease was taken: the lease did not hold it
                    self.lost += 1
                    log.warning("checkpoint v%d vanished while this searcher held a lease on it", manifest.version)
                self._gone(manifest, source, str(err))
            elif isinstance(err, CheckpointError):
                self._refuse(manifest, source, str(err))
            else:
                raise  # an I/O error reading a checkpoint that is there: counted, and retried at the next look
            return
        with self._lock:
            replaced = self._ready
            if replaced is None or manifest.version > replaced.version:
                self._ready = VerifiedCheckpoint(manifest, path)
                self._ready_event.set()
            else:
                replaced = VerifiedCheckpoint(manifest, path)  # a newer one got there first
        if replaced is not None:
            self.leases.release(replaced.manifest.path)
        log.info(
            "checkpoint v%d verified (from the %s%s); loading it after the current batch",
            manifest.version,
            source,
            "" if lease is Lease.HELD else ", without a lease: Redis is unreachable",
        )

    def reject(self, ckpt: VerifiedCheckpoint, reason: str) -> None:
        """Never offer ``ckpt`` again (it verified but the engine could not load it); look for the newest
        announced one at once."""
        self._rejected.add((ckpt.version, ckpt.manifest.content_hash))
        self.rejected += 1
        self.leases.release(ckpt.manifest.path)
        log.error("refusing checkpoint v%d: %s; keeping version %d", ckpt.version, reason, self.current_version)
        self._recheck.set()

    # --- what the watcher saw ---
    def _heard(self, manifest: CheckpointManifest) -> None:
        if manifest.version > self.newest_seen:
            self.newest_seen = manifest.version
        if self._newest is None or manifest.version > self._newest.version:
            self._newest = manifest
        self.lag.heard(manifest.version, age=time.time() - manifest.created_at)

    def _refuse(self, manifest: CheckpointManifest, source: str, reason: str) -> None:
        self._rejected.add((manifest.version, manifest.content_hash))
        self.rejected += 1
        log.error(
            "refusing checkpoint v%d (from the %s): %s; keeping version %d",
            manifest.version,
            source,
            reason,
            self.current_version,
        )

    def _gone(self, manifest: CheckpointManifest, source: str, reason: str) -> None:
        """``manifest``'s directory is not there: pruned (a newer one was announced: go to the newest) or not
        visible yet (it is the newest: the next look tries again)."""
        newest = self._newest
        if newest is not None and newest.version > manifest.version:
            self.vanished += 1
            log.info(
                "checkpoint v%d (from the %s) is gone before this searcher got to it (%s); skipping to the newest "
                "announced, v%d",
                manifest.version,
                source,
                reason,
                newest.version,
            )
            self.consider(newest, "newest announced")
        elif manifest.version not in self._missing_logged:
            self._missing_logged.add(manifest.version)
            log.warning("checkpoint v%d (from the %s) is not on disk yet: %s", manifest.version, source, reason)

    def _failed(self, err: BaseException, doing: str) -> None:
        self.errors += 1
        self.last_error = f"{type(err).__name__}: {err}"
        log.error("checkpoint watcher: %s failed (%s); it goes on", doing, self.last_error, exc_info=err)

    # --- background thread ---
    def start(self) -> CheckpointWatcher:
        self.leases.start()
        self._thread = threading.Thread(target=self._run, name="checkpoint-watcher", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        self.leases.stop()

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _read_key(self) -> CheckpointManifest | None:
        if self._client is None:
            self._client = self._client_factory()
        data = self._client.get(self.keys.latest_manifest)
        return parse_manifest(data) if data else None

    def _run(self) -> None:
        failures = backoff_delays(base=0.5, cap=30.0)
        while not self._stop.is_set():
            try:
                self._pass()
                failures = backoff_delays(base=0.5, cap=30.0)
            except Exception as err:  # noqa: BLE001 (logged and counted; the thread must not die)
                self._failed(err, "a pass")
                self._drop_subscription()
                self._stop.wait(next(failures))
        self._drop_subscription()

    def _pass(self) -> None:
        """One look: (re)subscribe when due, poll when due, then wait up to 0.2 s for an announcement."""
        now = time.monotonic()
        if self._pubsub is None and now >= self._next_subscribe:
            try:
                pubsub = self._client_factory().pubsub(ignore_subscribe_messages=True)
                pubsub.subscribe(self.keys.checkpoint_channel)
                self._pubsub = pubsub
                self._subscribe_delays = backoff_delays()
                self._next_poll = now  # messages may have been missed while unsubscribed
            except redis.RedisError as err:
                self._next_subscribe = now + next(self._subscribe_delays)
                log.debug("cannot subscribe to %s: %s", self.keys.checkpoint_channel, err)
        if self._recheck.is_set():
            self._recheck.clear()
            if self._newest is not None:
                self.consider(self._newest, "newest announced")
        if now >= self._next_poll:
            self.poll_once()
            self._next_poll = time.monotonic() + self.poll_seconds
        if self._pubsub is None:
            self._stop.wait(0.2)
            return
        newest: CheckpointManifest | None = None
        timeout = 0.2
        while True:  # every announcement waiting, the newest considered (a backlog after a pause names many)
            try:
                message = self._pubsub.get_message(timeout=timeout)
            except redis.RedisError as err:
                log.info("checkpoint subscription lost (%s); falling back to polling until it is back", err)
                self._drop_subscription()
                self._next_subscribe = time.monotonic() + next(self._subscribe_delays)
                break
            if message is None:
                break
            timeout = 0.0
            if message.get("type") != "message":
                continue
            try:
                manifest = parse_manifest(message["data"])
            except PayloadError as err:
                log.warning("ignoring a bad checkpoint announcement: %s", err)
                continue
            self._heard(manifest)  # each one: when it was published counts for the lag, not when it was read
            if newest is None or manifest.version > newest.version:
                newest = manifest
        if newest is not None:
            self.consider(newest, "announcement")

    def _drop_subscription(self) -> None:
        if self._pubsub is not None:
            try:
                self._pubsub.close()
            except Exception as err:  # noqa: BLE001 (closing a broken connection)
                log.debug("closing the checkpoint subscription: %s", err)
            self._pubsub = None
