"""The on-disk spill queue: groups Redis could not take wait here, in order.

One file per encoded group, named by a sequence number, written to a temporary
name, fsynced and renamed, so a crash leaves either a whole entry or none. The
queue survives restarts (a restarted searcher publishes what it had spilled)
and is locked, so two searchers never share (and double-publish) one queue.
A file that cannot be read back is moved to ``bad/`` and reported, never
published and never silently dropped.
"""

from __future__ import annotations

import fcntl
import logging
import os
from dataclasses import dataclass
from itertools import islice
from pathlib import Path

log = logging.getLogger(__name__)

SUFFIX = ".msgpack"
LOCK_NAME = ".lock"
BAD_DIR = "bad"


class SpillLockedError(RuntimeError):
    """Another live process holds this spill directory."""


@dataclass(frozen=True)
class SpillEntry:
    seq: int
    path: Path
    payload: bytes


class SpillQueue:
    """FIFO of byte payloads in a directory; ``max_bytes`` is the bound :meth:`full` reports."""

    def __init__(self, directory: str | Path, max_bytes: int) -> None:
        self.dir = Path(directory)
        self.max_bytes = max_bytes
        self.dir.mkdir(parents=True, exist_ok=True)
        self._lock_fd = os.open(self.dir / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self._lock_fd)
            raise SpillLockedError(
                f"spill directory {self.dir} is in use by another searcher (give each replica its own TBA_SPILL_DIR)"
            ) from None
        found: dict[int, int] = {}
        for path in self.dir.glob(f"*{SUFFIX}"):
            stem = path.name.removesuffix(SUFFIX)
            if stem.isdigit():
                found[int(stem)] = path.stat().st_size
        # Insertion order is sequence order (puts only append larger numbers): iteration is FIFO.
        self._sizes: dict[int, int] = dict(sorted(found.items()))
        for tmp in self.dir.glob(".tmp-*"):  # a write cut short by a crash: never renamed, never counted
            tmp.unlink(missing_ok=True)
        self._next = max(self._sizes, default=-1) + 1
        self._nbytes = sum(self._sizes.values())
        self.bad_entries = 0
        if self._sizes:
            log.warning(
                "spill queue %s holds %d groups from a previous run; they will be published first",
                self.dir,
                len(self._sizes),
            )

    def __len__(self) -> int:
        return len(self._sizes)

    @property
    def nbytes(self) -> int:
        return self._nbytes

    def full(self) -> bool:
        return self._nbytes >= self.max_bytes

    def _path(self, seq: int) -> Path:
        return self.dir / f"{seq:012d}{SUFFIX}"

    def put(self, payload: bytes) -> None:
        """Append one payload durably (fsync before rename)."""
        seq = self._next
        self._next += 1
        tmp = self.dir / f".tmp-{seq:012d}"
        with tmp.open("wb") as f:
            f.write(payload)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self._path(seq))
        self._sizes[seq] = len(payload)
        self._nbytes += len(payload)

    def peek(self, limit: int) -> list[SpillEntry]:
        """The oldest ``limit`` readable entries, in order (unreadable ones are quarantined)."""
        out: list[SpillEntry] = []
        for seq in list(islice(self._sizes, limit)):
            path = self._path(seq)
            try:
                out.append(SpillEntry(seq, path, path.read_bytes()))
            except OSError as err:
                self._quarantine(seq, f"cannot read: {err}")
        return out

    def remove(self, entries: list[SpillEntry]) -> None:
        """Forget entries that reached Redis."""
        for e in entries:
            e.path.unlink(missing_ok=True)
            self._nbytes -= self._sizes.pop(e.seq, 0)

    def quarantine(self, entry: SpillEntry, reason: str) -> None:
        self._quarantine(entry.seq, reason)

    def _quarantine(self, seq: int, reason: str) -> None:
        bad = self.dir / BAD_DIR
        bad.mkdir(exist_ok=True)
        src = self._path(seq)
        if src.exists():
            os.replace(src, bad / src.name)
        self._nbytes -= self._sizes.pop(seq, 0)
        self.bad_entries += 1
        log.error("spill entry %s moved to %s: %s", src.name, bad, reason)

    def close(self) -> None:
        if self._lock_fd >= 0:
            fcntl.flock(self._lock_fd, fcntl.LOCK_UN)
            os.close(self._lock_fd)
            self._lock_fd = -1
