"""Optional pacing: hold generation back when it runs too far ahead of training.

TBA's searchers run free in the paper: on a GPU cluster each has its own device, so
generating ahead of the trainer costs nothing but staleness, which the off-policy loss
accepts. Where searchers and the trainer share CPU cores (the local demo), every batch
generated far ahead takes cycles from the trainer and mostly lands in the buffer as
duplicates. ``TBA_MAX_BATCHES_PER_VERSION`` caps the batches a searcher generates with one
policy version: past it, the searcher waits for a newer checkpoint, at most
``TBA_PACE_MAX_WAIT_SECONDS`` (then it generates one more batch, so a stalled trainer
never stalls the searchers for good).
"""

from __future__ import annotations

import time
from collections.abc import Callable


class Pacer:
    def __init__(
        self, max_batches_per_version: int | None, max_wait_seconds: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.limit = max_batches_per_version
        self.max_wait = max_wait_seconds
        self.clock = clock
        self.version: int | None = None
        self.batches = 0
        self.waiting_since: float | None = None
        self.waited_seconds = 0.0

    def generated(self, version: int) -> None:
        """One batch generated with ``version``."""
        if version != self.version:
            self.version, self.batches = version, 0
        self.batches += 1
        self.waiting_since = None

    def should_wait(self, version: int) -> bool:
        """True while the current policy has had its share of batches and the wait is not over."""
        if self.limit is None or version != self.version or self.batches < self.limit:
            self.waiting_since = None
            return False
        now = self.clock()
        if self.waiting_since is None:
            self.waiting_since = now
        return now - self.waiting_since < self.max_wait

    def waited(self, seconds: float) -> None:
        """The caller slept this long for a newer policy (exported as a counter)."""
        self.waited_seconds += seconds
