"""The checkpoint watcher: learns of new policy versions and verifies them off the generation path.

Three sources, newest version wins: the Redis announcement (pub/sub, instant),
the Redis key holding the newest manifest, and the checkpoint root's ``LATEST``
file (both polled every ``reload_poll_seconds``, and at once after a
reconnect, so a searcher that started late or missed a message catches up).
A background thread hashes the candidate directory (``CheckpointStore.verify``)
while generation goes on; the loop only ever sees checkpoints that verified,
and :meth:`take` hands it the newest one, skipping any older that arrived in
between. A checkpoint whose hash does not match is refused for good; a missing
directory is retried (shared storage may show it late).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import redis

from tba.checkpoints import CheckpointError, CheckpointStore, parse_manifest
from tba.codec import PayloadError
from tba.keys import Keys
from tba.retry import backoff_delays
from tba.schemas import CheckpointManifest

log = logging.getLogger(__name__)


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
    ) -> None:
        self._client_factory = client_factory
        self.keys = keys
        self.store = store
        self.poll_seconds = poll_seconds
        self.current_version = current_version  # written by the loop after each reload
        self.rejected = 0
        self.newest_seen = current_version
        self._rejected: set[tuple[int, str]] = set()
        self._missing_logged: set[int] = set()
        self._ready: VerifiedCheckpoint | None = None
        self._ready_event = threading.Event()  # set while a verified checkpoint waits to be taken
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._client: redis.Redis | None = None

    # --- used by the loop ---
    def take(self) -> VerifiedCheckpoint | None:
        """The newest verified checkpoint newer than ``current_version``, once; None if there is none."""
        with self._lock:
            ready, self._ready = self._ready, None
            self._ready_event.clear()
        return ready if ready is not None and ready.version > self.current_version else None

    def wait_ready(self, timeout: float) -> bool:
        """Block until a verified checkpoint waits to be taken (True) or ``timeout`` passes (False): a paced
        searcher starts on a new policy the moment it is verified, not at its next look."""
        return self._ready_event.wait(timeout)

    @property
    def ready_version(self) -> int | None:
        ready = self._ready
        return ready.version if ready is not None else None

    def poll_once(self) -> None:
        """Read the manifest key and the LATEST file now (start-up, and the periodic fallback)."""
        for source, read in (("redis key", self._read_key), ("LATEST file", self.store.read_manifest)):
            try:
                manifest = read()
            except (redis.RedisError, PayloadError, OSError) as err:
                log.debug("cannot read the manifest from the %s: %s", source, err)
                continue
            if manifest is not None:
                self.consider(manifest, source)

    def consider(self, manifest: CheckpointManifest, source: str) -> None:
        """Verify ``manifest`` if it is newer than anything loaded or ready; keep it if it verifies."""
        newest = max(self.current_version, self.ready_version or -1)
        self.newest_seen = max(self.newest_seen, manifest.version)
        if manifest.version <= newest or (manifest.version, manifest.content_hash) in self._rejected:
            return
        try:
            path = self.store.verify(manifest)
        except CheckpointError as err:
            if not self.store.resolve(manifest).exists():
                if manifest.version not in self._missing_logged:
                    self._missing_logged.add(manifest.version)
                    log.warning("checkpoint v%d (from the %s) is not on disk yet: %s", manifest.version, source, err)
                return
            self._rejected.add((manifest.version, manifest.content_hash))
            self.rejected += 1
            log.error(
                "refusing checkpoint v%d (from the %s): %s; keeping version %d",
                manifest.version,
                source,
                err,
                self.current_version,
            )
            return
        with self._lock:
            if self._ready is None or manifest.version > self._ready.version:
                self._ready = VerifiedCheckpoint(manifest, path)
                self._ready_event.set()
        log.info("checkpoint v%d verified (from the %s); loading it after the current batch", manifest.version, source)

    def reject(self, ckpt: VerifiedCheckpoint, reason: str) -> None:
        """Never offer ``ckpt`` again (it verified but the engine could not load it)."""
        self._rejected.add((ckpt.version, ckpt.manifest.content_hash))
        self.rejected += 1
        log.error("refusing checkpoint v%d: %s; keeping version %d", ckpt.version, reason, self.current_version)

    # --- background thread ---
    def start(self) -> CheckpointWatcher:
        self._thread = threading.Thread(target=self._run, name="checkpoint-watcher", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def _read_key(self) -> CheckpointManifest | None:
        if self._client is None:
            self._client = self._client_factory()
        data = self._client.get(self.keys.latest_manifest)
        return parse_manifest(data) if data else None

    def _run(self) -> None:
        delays = backoff_delays()
        pubsub = None
        next_subscribe = next_poll = 0.0
        while not self._stop.is_set():
            now = time.monotonic()
            if pubsub is None and now >= next_subscribe:
                try:
                    pubsub = self._client_factory().pubsub(ignore_subscribe_messages=True)
                    pubsub.subscribe(self.keys.checkpoint_channel)
                    delays = backoff_delays()
                    next_poll = now  # messages may have been missed while unsubscribed
                except redis.RedisError as err:
                    pubsub = None
                    next_subscribe = now + next(delays)
                    log.debug("cannot subscribe to %s: %s", self.keys.checkpoint_channel, err)
            if now >= next_poll:
                self.poll_once()
                next_poll = time.monotonic() + self.poll_seconds
            if pubsub is None:
                self._stop.wait(0.2)
                continue
            try:
                message = pubsub.get_message(timeout=0.2)
            except redis.RedisError as err:
                log.info("checkpoint subscription lost (%s); falling back to polling until it is back", err)
                pubsub.close()
                pubsub = None
                next_subscribe = time.monotonic() + next(delays)
                continue
            if message and message.get("type") == "message":
                try:
                    self.consider(parse_manifest(message["data"]), "announcement")
                except PayloadError as err:
                    log.warning("ignoring a bad checkpoint announcement: %s", err)
        if pubsub is not None:
            pubsub.close()
