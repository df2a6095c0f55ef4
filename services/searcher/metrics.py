"""What a searcher reports: one status snapshot, shown as JSON on ``/status`` and as Prometheus metrics.

Counters live in plain fields updated by the thread that owns them; the
Prometheus collector reads the same snapshot ``/status`` serves at scrape
time, so the two views never disagree. Rates are over a sliding window.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from tba.model.episodes import FAILURE_KINDS

PREFIX = "tba_searcher_"

# status field -> (metric kind, help). Counters get the ``_total`` suffix from prometheus_client.
EXPORTED: dict[str, tuple[str, str]] = {
    "version": ("gauge", "Policy version the engine's weights carry."),
    "batches": ("counter", "Generation batches completed."),
    "groups_generated": ("counter", "Groups generated and scored."),
    "samples_generated": ("counter", "Completions generated and scored."),
    "tokens_generated": ("counter", "Completion tokens generated."),
    "groups_published": ("counter", "Groups that reached the trajectory stream."),
    "samples_published": ("counter", "Completions that reached the trajectory stream."),
    "groups_per_s": ("gauge", "Groups per second, sliding window."),
    "samples_per_s": ("gauge", "Completions per second, sliding window."),
    "tokens_per_s": ("gauge", "Completion tokens per second, sliding window."),
    "reloads": ("counter", "Checkpoints loaded in place."),
    "reload_ms_last": ("gauge", "Generation pause of the last reload, in milliseconds."),
    "rejected_checkpoints": ("counter", "Checkpoints refused (hash mismatch or failed load)."),
    "reload_failures": ("counter", "Reloads that failed (the engine kept the weights it served)."),
    "vanished_checkpoints": ("counter", "Checkpoints gone before the watcher got to them (skipped for the newest)."),
    "lost_checkpoints": ("counter", "Checkpoints that vanished while this searcher held a lease on them."),
    "watcher_errors": ("counter", "Exceptions in the checkpoint watcher, each logged (the watcher went on)."),
    "watcher_alive": ("gauge", "1 while the checkpoint watcher's thread runs."),
    "leases_held": ("gauge", "Checkpoints this searcher holds a lease on (verifying, loading, serving)."),
    "lease_errors": ("counter", "Lease renewals that failed (tried again)."),
    "newest_seen_version": ("gauge", "Newest policy version announced."),
    "version_lag": ("gauge", "Versions between the newest announced and the one served."),
    "lag_over_bound_s": ("gauge", "Seconds the served version has been more than TBA_MAX_STALENESS behind."),
    "lagging": ("gauge", "1 while over the bound for longer than TBA_LAG_SECONDS (/readyz answers 503)."),
    "reload_hung": ("gauge", "1 while a reload has not returned within TBA_RELOAD_TIMEOUT_SECONDS (/readyz 503)."),
    "version_lag_max": ("gauge", "Largest version lag of a batch generated."),
    "version_lag_mean": ("gauge", "Mean version lag of the samples generated."),
    "samples_too_stale": (
        "counter",
        "Completions generated at a version more than TBA_MAX_STALENESS behind the newest announced.",
    ),
    "spilled": ("gauge", "Groups waiting in the on-disk spill queue."),
    "spill_bytes": ("gauge", "Bytes in the on-disk spill queue."),
    "spilled_total": ("counter", "Groups ever written to the spill queue."),
    "dropped_samples": ("counter", "Completions dropped as unusable (empty, aborted, non-finite)."),
    "episodes": ("counter", "Multi-turn episodes run."),
    "episode_turns": ("counter", "Model turns taken in multi-turn episodes."),
    "env_tokens": ("counter", "Tokens the environment wrote into multi-turn trajectories (context, not trained on)."),
    "paced_seconds": ("counter", "Seconds paused by TBA_MAX_BATCHES_PER_VERSION or TBA_MAX_SAMPLES_AHEAD."),
    "samples_ahead": ("gauge", "Samples generated and not yet trained on, at the ahead rule's last look."),
    "redis_up": ("gauge", "1 if the last Redis write succeeded."),
    "ready": ("gauge", "1 once the engine is loaded and generating."),
}


class RateWindow:
    """Events per second over the last ``window`` seconds."""

    def __init__(self, window: float = 30.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.window = window
        self._clock = clock
        self._events: deque[tuple[float, int, int, int]] = deque()
        self._lock = threading.Lock()
        self._start = clock()

    def add(self, groups: int, samples: int, tokens: int) -> None:
        with self._lock:
            self._events.append((self._clock(), groups, samples, tokens))

    def rates(self) -> tuple[float, float, float]:
        """(groups/s, samples/s, tokens/s)."""
        now = self._clock()
        with self._lock:
            while self._events and self._events[0][0] < now - self.window:
                self._events.popleft()
            events = list(self._events)
        span = min(self.window, max(now - self._start, 1e-9))
        return tuple(sum(e[k] for e in events) / span for k in (1, 2, 3))  # type: ignore[return-value]


class StatusCollector:
    """A Prometheus collector over a status snapshot function."""

    def __init__(self, snapshot: Callable[[], dict]) -> None:
        self._snapshot = snapshot

    def collect(self) -> Iterator[Metric]:
        status = self._snapshot()
        for field, (kind, help_text) in EXPORTED.items():
            value = float(status.get(field) or 0)
            family = CounterMetricFamily if kind == "counter" else GaugeMetricFamily
            yield family(PREFIX + field, help_text, value=value)
        failures = CounterMetricFamily(
            PREFIX + "episode_failures",
            "Multi-turn episodes ended early, not trained on, by what failed.",
            labels=["kind"],
        )
        for kind in FAILURE_KINDS:  # every series from the start, so a rate() sees the first failure
            failures.add_metric([kind], float((status.get("episode_failures") or {}).get(kind, 0)))
        yield failures


def reload_histogram(registry: CollectorRegistry) -> Histogram:
    return Histogram(
        PREFIX + "reload_seconds",
        "Generation pause per in-place reload, in seconds.",
        buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
        registry=registry,
    )
