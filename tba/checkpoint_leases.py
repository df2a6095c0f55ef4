"""Leases on checkpoints: a searcher that has begun to verify or load a checkpoint holds it until it is done,
and the trainer's pruning deletes no checkpoint a live lease holds.

Searchers mount the checkpoint volume read-only (docs/architecture.md §4), so they cannot pin a checkpoint
on disk; the lease lives in Redis, beside the announcements, and the trainer, the only process that deletes
checkpoints, honours it. Two sorted sets in one hash slot (``{ckpt}``, so each script runs on Redis Cluster):

- ``leases``: ``<holder>\\n<directory>`` -> the time the lease expires. A holder renews its leases every
  quarter of their length; one that dies stops renewing, and its checkpoints become prunable when the
  lease expires.
- ``pruning``: directory -> the time the trainer began deleting it, cleared once it is gone.

The race between a searcher taking a lease and the trainer deciding to delete is closed by making both
steps one script each: :meth:`CheckpointLeases.claim` marks a directory ``pruning`` only where no live
lease names it, and :meth:`CheckpointLeases.acquire` refuses a directory marked ``pruning``. Redis runs
scripts one at a time, so either the lease comes first (the trainer spares the checkpoint) or the mark
does (the searcher skips it); once the mark is cleared the directory is gone, which the searcher sees.
Every time is Redis's own clock (``TIME``), so hosts whose clocks differ agree on expiry.
"""

from __future__ import annotations

from collections.abc import Sequence

from tba.keys import Keys

# A mark older than this is a trainer that died while deleting: it no longer stops a lease.
PRUNING_MARK_SECONDS = 600.0
SEPARATOR = "\n"  # between holder and directory in a lease's member (neither contains a newline)

_NOW = "local t = redis.call('TIME') local now = tonumber(t[1]) + tonumber(t[2]) / 1000000\n"

# KEYS: leases, pruning. ARGV: holder, ttl, mark_seconds, then directories. Returns, per directory,
# 1 (held until now + ttl) or 0 (being pruned: not held).
ACQUIRE = (
    _NOW
    + """
local holder, ttl, mark_seconds = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local out = {}
for i = 4, #ARGV do
  local marked = redis.call('ZSCORE', KEYS[2], ARGV[i])
  if marked and now - tonumber(marked) < mark_seconds then
    redis.call('ZREM', KEYS[1], holder .. '\\n' .. ARGV[i])
    out[#out + 1] = 0
  else
    redis.call('ZADD', KEYS[1], now + ttl, holder .. '\\n' .. ARGV[i])
    out[#out + 1] = 1
  end
end
return out
"""
)

# KEYS: leases, pruning. ARGV: mark_seconds, then directories. Drops expired leases and stale marks, marks
# every directory no live lease holds as being pruned, and returns those.
CLAIM = (
    _NOW
    + """
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now - tonumber(ARGV[1]))
local held = {}
for _, member in ipairs(redis.call('ZRANGE', KEYS[1], 0, -1)) do
  held[string.match(member, '\\n([^\\n]*)$') or ''] = true
end
local out = {}
for i = 2, #ARGV do
  if not held[ARGV[i]] then
    redis.call('ZADD', KEYS[2], now, ARGV[i])
    out[#out + 1] = ARGV[i]
  end
end
return out
"""
)


class CheckpointLeases:
    """The lease protocol over one Redis client (a single Redis or a cluster)."""

    def __init__(self, client, keys: Keys, mark_seconds: float = PRUNING_MARK_SECONDS) -> None:
        self.client = client
        self.keys = keys
        self.mark_seconds = mark_seconds
        self._acquire = client.register_script(ACQUIRE)
        self._claim = client.register_script(CLAIM)

    @property
    def _both(self) -> list[str]:
        return [self.keys.checkpoint_leases, self.keys.checkpoint_pruning]

    # --- a reader (searcher) ---
    def acquire(self, holder: str, directories: Sequence[str], ttl: float) -> list[bool]:
        """Hold (or renew) a lease on each directory until ``ttl`` seconds from now; False where the trainer is
        deleting it. Raises the client's error when Redis cannot be reached."""
        if not directories:
            return []
        _check_names([holder, *directories])
        answer = self._acquire(keys=self._both, args=[holder, repr(float(ttl)), repr(self.mark_seconds), *directories])
        return [bool(int(a)) for a in answer]

    def release(self, holder: str, directories: Sequence[str]) -> None:
        if directories:
            self.client.zrem(self.keys.checkpoint_leases, *(f"{holder}{SEPARATOR}{d}" for d in directories))

    def held(self) -> dict[str, list[str]]:
        """Directory -> the holders of a live lease on it (for operators and tests)."""
        now = _redis_time(self.client)
        out: dict[str, list[str]] = {}
        for member, expiry in self.client.zrange(self.keys.checkpoint_leases, 0, -1, withscores=True):
            holder, _, directory = _text(member).rpartition(SEPARATOR)
            if expiry > now:
                out.setdefault(directory, []).append(holder)
        return out

    # --- the writer (trainer) ---
    def claim(self, directories: Sequence[str]) -> list[str]:
        """Of ``directories``, those no live lease holds, each now marked as being pruned: the caller deletes
        them, then calls :meth:`pruned`. Raises the client's error when Redis cannot be reached."""
        if not directories:
            return []
        _check_names(directories)
        return [_text(d) for d in self._claim(keys=self._both, args=[repr(self.mark_seconds), *directories])]

    def pruned(self, directories: Sequence[str]) -> None:
        """The directories are deleted: clear their marks (a lease taken from now on finds them gone)."""
        if directories:
            self.client.zrem(self.keys.checkpoint_pruning, *directories)


def _check_names(names: Sequence[str]) -> None:
    for name in names:
        if not name or SEPARATOR in name:
            raise ValueError(f"a lease holder or directory must be a non-empty single line, got {name!r}")


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _redis_time(client) -> float:
    seconds, micros = client.time()
    return float(seconds) + float(micros) / 1e6
