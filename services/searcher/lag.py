"""How far behind the trainer a searcher is, and the rule that makes a lagging searcher unready.

A sample generated at version v is trained on only while the trainer's version is at most v + the staleness
bound (``TBA_MAX_STALENESS``). The trainer is never behind the newest version announced, so a searcher that
serves a version more than the bound behind the newest announced generates samples nobody can train on. A
reload within the bound ends that; a searcher that stays over the bound for longer than ``TBA_LAG_SECONDS``
without once coming back within it is lagging: its watcher is stuck, its reloads fail, or it is too slow to
keep up (a reload that still leaves it over the bound does not restart the clock).

:class:`VersionLag` keeps the newest version announced, the version served, and since when the served one has
been more than the bound behind. A version heard late (a watcher starved of CPU, or reading a backlog) counts
from when it was published, as its manifest says, so the clock does not start late. The clock is the caller's
(monotonic), so a test sets the time.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class LagState:
    served: int
    newest: int  # the newest version announced
    over_since: float | None  # since when the served version has been more than the bound behind (None: it is not)
    over_seconds: float  # how long, so far (0: not over the bound)
    lagging: bool  # over the bound for longer than the setting

    @property
    def behind(self) -> int:
        return max(0, self.newest - self.served)


class VersionLag:
    def __init__(self, bound: int | None, seconds: float, clock: Callable[[], float], served: int = 0) -> None:
        """``bound``: the staleness bound in versions (None: no bound, so never lagging); ``seconds``: how long
        a searcher may stay more than ``bound`` behind."""
        self.bound = bound
        self.seconds = seconds
        self.clock = clock
        self.newest = self.served = served
        self._served_at = clock()
        self._over_since: float | None = None
        self._lock = threading.Lock()

    def heard(self, version: int, age: float = 0.0) -> None:
        """A version was announced, ``age`` seconds ago (only a newer one than any heard counts)."""
        with self._lock:
            if version > self.newest:
                self.newest = version
                self._update(max(self.clock() - max(0.0, age), self._served_at))

    def serving(self, version: int) -> None:
        """The engine now serves ``version``."""
        with self._lock:
            self.served, self._served_at = version, self.clock()
            self.newest = max(self.newest, version)
            self._update(self._served_at)

    def _update(self, at: float) -> None:
        over = self.bound is not None and self.newest - self.served > self.bound
        if not over:
            self._over_since = None
        elif self._over_since is None:
            self._over_since = at

    def state(self, now: float | None = None) -> LagState:
        now = self.clock() if now is None else now
        with self._lock:
            since, served, newest = self._over_since, self.served, self.newest
        over = 0.0 if since is None else max(0.0, now - since)
        return LagState(served, newest, since, over, since is not None and over > self.seconds)


class LagTally:
    """The version lag of what a searcher generated, sample-weighted: mean, max, and the samples generated at a
    version already more than the bound behind the newest announced (too stale to train on when they arrive)."""

    def __init__(self, bound: int | None) -> None:
        self.bound = bound
        self.samples = 0
        self.too_stale = 0
        self.lag_max = 0
        self._lag_sum = 0

    def add(self, samples: int, lag: int) -> None:
        lag = max(0, lag)
        self.samples += samples
        self._lag_sum += samples * lag
        self.lag_max = max(self.lag_max, lag)
        if self.bound is not None and lag > self.bound:
            self.too_stale += samples

    @property
    def lag_mean(self) -> float | None:
        return self._lag_sum / self.samples if self.samples else None
