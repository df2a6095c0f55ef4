"""Optional pacing: hold generation back when it runs too far ahead of training.

TBA's searchers run free in the paper: on a GPU cluster each has its own device, so
generating ahead of the trainer costs nothing but staleness, which the off-policy loss
accepts. Where searchers and the trainer share CPU cores, or where one trainer cannot
consume what the searchers generate, every batch generated far ahead takes cycles from the
trainer or lands in the buffer untrained. Two rules hold a searcher back, each optional:

- ``TBA_MAX_BATCHES_PER_VERSION`` caps the batches it generates with one policy version:
  past it, it waits for a newer checkpoint (the services take turns).
- ``TBA_MAX_SAMPLES_AHEAD`` caps the samples generated and not yet trained on, over every
  searcher (``Searcher.samples_ahead``: the buffer's samples taken in minus those served, the
  groups still in the stream, this searcher's own being scored): past it, it waits for the
  trainer to draw. Set to one training batch, the next batch is ready when the trainer asks for
  it and little more is generated. The counts are cumulative, so the rule is for a trainer that
  draws whatever is stored: the exactly on-policy trainer never draws older versions' samples,
  which would count as ahead for good (``tba up --mode sync`` turns the rule off).

Either pause lasts at most ``TBA_PACE_MAX_WAIT_SECONDS``, or twice the trainer's last
interval between policy versions where that is longer; then the searcher generates one more
batch, so a stalled trainer, or a trainer waiting for more than the cap, never stalls the
searchers for good. The trainer's own pace sets the bound because a trainer whose step takes
longer than a fixed bound is not stalled: a batch generated in its place is generated with the
old policy, which the exactly on-policy loop then discards, and the new policy waits for it.
"""

from __future__ import annotations

import time
from collections.abc import Callable

POLICY = "policy"  # paused for a newer policy version
TRAINER = "trainer"  # paused for the trainer to draw what was generated
CYCLES_BEFORE_FALLBACK = 2.0  # a trainer silent for this many of its last intervals between versions is stalled


class Pacer:
    def __init__(
        self,
        max_batches_per_version: int | None,
        max_wait_seconds: float,
        clock: Callable[[], float] = time.monotonic,
        *,
        max_samples_ahead: int | None = None,
        samples_ahead: Callable[[], int | None] = lambda: None,
    ) -> None:
        self.limit = max_batches_per_version
        self.max_ahead = max_samples_ahead
        self.samples_ahead = samples_ahead  # None when it cannot be read (Redis away): then it does not hold back
        self.max_wait = max_wait_seconds
        self.clock = clock
        self.version: int | None = None
        self.batches = 0
        self.waiting_since: float | None = None
        self.waited_seconds = 0.0
        self.ahead: int | None = None  # the samples ahead at the last look, for /status
        self.newest: tuple[int, float] | None = None  # the newest version seen and when it was first seen
        self.first_version = 0  # the version served at the first look
        self.cycle: float | None = None  # seconds between the last two versions seen after the first
        self.gave_up = False  # a pause ran out since the newest version was seen

    def generated(self, version: int) -> None:
        """One batch generated with ``version``."""
        if version != self.version:
            self.version, self.batches = version, 0
        self.batches += 1
        self.waiting_since = None

    def should_wait(self, version: int) -> str | None:
        """Why to pause before the next batch (:data:`POLICY` or :data:`TRAINER`), or None to generate it."""
        now = self.clock()
        self._observe(version, now)
        reason = self._reason(version)
        if reason is None:
            self.waiting_since = None
            return None
        if self.waiting_since is None:
            self.waiting_since = now
        if now - self.waiting_since < self.longest_wait():
            return reason
        self.gave_up = True
        return None

    def longest_wait(self) -> float:
        """The longest pause: the configured bound, or the trainer's recent pace where that is slower."""
        return self.max_wait if self.cycle is None else max(self.max_wait, CYCLES_BEFORE_FALLBACK * self.cycle)

    def _observe(self, version: int, now: float) -> None:
        """Time the trainer's pace by the versions this searcher serves. Left out: the interval up to the first
        version after the one it started with (it holds the trainer's start-up and warm-up, not its step), and an
        interval in which a pause ran out (the trainer may have waited for that batch: timed, the pause would
        feed on itself, each longer than the last)."""
        if self.newest is not None and version > self.newest[0]:
            if self.newest[0] > self.first_version and not self.gave_up:
                self.cycle = now - self.newest[1]
            self.newest, self.gave_up = (version, now), False
        elif self.newest is None:
            self.newest, self.first_version = (version, now), version

    def _reason(self, version: int) -> str | None:
        if self.limit is not None and version == self.version and self.batches >= self.limit:
            return POLICY
        if self.max_ahead is not None:
            self.ahead = self.samples_ahead()
            if self.ahead is not None and self.ahead >= self.max_ahead:
                return TRAINER
        return None

    def waited(self, seconds: float) -> None:
        """The caller slept this long (exported as a counter)."""
        self.waited_seconds += seconds
