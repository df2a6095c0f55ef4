"""The leases one searcher holds on checkpoints (:mod:`tba.checkpoint_leases`), renewed in the background.

A searcher leases a checkpoint before it verifies it and holds the lease until it no longer needs the files:
the checkpoint it is loading, and the one whose weights it serves (a failed reload loads those back). A
thread of its own renews every lease each quarter of its length, so a long hash or a reload that hangs does
not let a lease lapse; a searcher that dies stops renewing, and the trainer may prune its checkpoints once
their leases expire. Renewal never stops the thread: an error is logged and counted, and tried again.
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Callable
from enum import StrEnum

import redis

from tba.checkpoint_leases import CheckpointLeases

log = logging.getLogger(__name__)


class Lease(StrEnum):
    HELD = "held"  # the trainer will not delete it while this searcher renews the lease
    PRUNING = "pruning"  # the trainer is deleting it: skip it
    UNAVAILABLE = "unavailable"  # Redis cannot be reached: no lease (the trainer prunes nothing meanwhile)


class LeaseKeeper:
    def __init__(self, leases: Callable[[], CheckpointLeases], searcher_id: str, ttl: float) -> None:
        self._make = leases
        self._leases: CheckpointLeases | None = None
        # One holder per process: a restarted searcher's leases are its own, its predecessor's simply expire.
        self.holder = f"{searcher_id}:{uuid.uuid4().hex[:8]}".replace("\n", " ")
        self.ttl = ttl
        self.errors = 0
        self.lost = 0  # leases found taken by pruning at a renewal (a searcher stopped for longer than ttl)
        self._held: set[str] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def held(self) -> set[str]:
        with self._lock:
            return set(self._held)

    def acquire(self, directory: str) -> Lease:
        """Lease ``directory`` (renewed from now on) unless the trainer is deleting it."""
        try:
            (ok,) = self._client().acquire(self.holder, [directory], self.ttl)
        except redis.RedisError as err:
            self._leases = None
            log.debug("no lease on %s: %s", directory, err)
            return Lease.UNAVAILABLE
        if not ok:
            return Lease.PRUNING
        with self._lock:
            self._held.add(directory)
        return Lease.HELD

    def release(self, *directories: str) -> None:
        """Done with ``directories``: stop renewing, and drop the leases now (else they expire)."""
        with self._lock:
            gone = [d for d in directories if d in self._held]
            self._held.difference_update(gone)
        if not gone:
            return
        try:
            self._client().release(self.holder, gone)
        except redis.RedisError as err:
            self._leases = None
            log.debug("could not release the leases on %s (they expire): %s", gone, err)

    def renew(self) -> None:
        """Renew every lease held now; one the trainer took in the meantime is dropped and counted."""
        held = sorted(self.held)
        if not held:
            return
        answers = self._client().acquire(self.holder, held, self.ttl)
        lost = [d for d, ok in zip(held, answers, strict=True) if not ok]
        if lost:
            with self._lock:
                self._held.difference_update(lost)
            self.lost += len(lost)
            log.warning("the leases on %s lapsed and the trainer is pruning them", lost)

    def start(self) -> LeaseKeeper:
        self._thread = threading.Thread(target=self._run, name="checkpoint-leases", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        self.release(*self.held)

    def _client(self) -> CheckpointLeases:
        if self._leases is None:
            self._leases = self._make()
        return self._leases

    def _run(self) -> None:
        while not self._stop.wait(self.ttl / 4):
            try:
                self.renew()
            except Exception as err:  # noqa: BLE001 (a renewal failure must not end the renewals)
                self._leases = None
                self.errors += 1
                log.warning("could not renew checkpoint leases (%s: %s); trying again", type(err).__name__, err)
