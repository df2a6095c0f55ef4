"""How far behind the trainer a searcher is, and the rule that makes a lagging searcher unready.

A sample generated at version v is trained on only while the trainer's version is at most v + the staleness
bound (``TBA_MAX_STALENESS``). The trainer is never behind the newest version announced, so a searcher that
serves a version more than the bound behind the newest announced generates samples nobody can train on. A
reload ends that (it loads the newest verified version); a searcher that stays so for longer than
``TBA_LAG_SECONDS`` is lagging: its watcher is stuck, its reloads fail, or it is too slow to keep up.

:class:`VersionLag` keeps, for every version newer than the one served, when the searcher heard of it: the
searcher has been over the bound since it heard of the first version more than the bound above what it
serves, however the two moved in between. The clock is the caller's (monotonic), so a test sets the time.
"""

from __future__ import annotations

import threading
from collections import deque
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
    def __init__(self, bound: int | None, seconds: float, clock: Callable[[], float]) -> None:
        """``bound``: the staleness bound in versions (None: no bound, so never lagging); ``seconds``: how long
        a searcher may stay more than ``bound`` behind."""
        self.bound = bound
        self.seconds = seconds
        self.clock = clock
        self.newest = 0
        self._heard: deque[tuple[int, float]] = deque()  # (version, when heard), versions increasing
        self._lock = threading.Lock()

    def heard(self, version: int, at: float | None = None) -> None:
        """A version was announced (only a newer one than any heard counts)."""
        with self._lock:
            if version > self.newest:
                self.newest = version
                self._heard.append((version, self.clock() if at is None else at))

    def state(self, served: int, now: float | None = None) -> LagState:
        now = self.clock() if now is None else now
        with self._lock:
            while self._heard and self._heard[0][0] <= served:  # caught up with these
                self._heard.popleft()
            newest = self.newest
            since = None
            if self.bound is not None:
                since = next((t for v, t in self._heard if v - served > self.bound), None)
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
