"""Prometheus metrics and ingest/sample rates of one buffer replica.

Each app gets its own registry (several apps in one test process must not
collide). Process-local counters (requests, latencies, this replica's ingest)
are Prometheus counters; the buffer-wide figures (stored samples, per-version
counts) come from Redis at scrape time, so every replica reports the same.
"""

from __future__ import annotations

import time
from collections import deque
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from services.buffer.store import WriteResult

_GAUGES = (
    "prompts",
    "samples",
    "samples_ingested",
    "samples_duplicate",
    "samples_evicted",
    "samples_dead_lettered",
    "groups_ingested",
    "groups_stored",
    "dead_letters",
    "samples_served",
    "samples_served_distinct",
    "samples_stored_total",
    "dedup_records",
)


class BufferMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "tba_buffer_http_requests", "HTTP requests by route and status", ["route", "status"], registry=r
        )
        self.sample_seconds = Histogram(
            "tba_buffer_sample_seconds",
            "Latency of POST /v1/sample",
            buckets=(0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5),
            registry=r,
        )
        self.ingested = Counter(
            "tba_buffer_ingest_samples",
            "Samples this replica took from the stream, by outcome",
            ["outcome"],
            registry=r,
        )
        self.entries = Counter(
            "tba_buffer_ingest_entries", "Stream entries this replica handled, by kind", ["kind"], registry=r
        )
        self.buffer = Gauge(
            "tba_buffer_state", "Buffer-wide figures from Redis (samples unless named)", ["figure"], registry=r
        )
        self.versions = Gauge(
            "tba_buffer_version_samples", "Stored samples per policy version", ["version"], registry=r
        )
        self.rates = RateTracker()

    def observe_ingest(self, kind: str, n: int, result: WriteResult | None) -> None:
        self.entries.labels(kind).inc()
        if result is not None:
            self.ingested.labels("stored").inc(result.added)
            self.ingested.labels("duplicate").inc(result.duplicates)
        elif kind == "dead":
            self.ingested.labels("dead_lettered").inc(n)

    def render(self, stats: dict[str, Any]) -> bytes:
        for name in _GAUGES:
            value = stats.get(name)
            if value is not None:
                self.buffer.labels(name).set(value)
        self.versions.clear()
        for version, count in stats.get("versions", {}).items():
            self.versions.labels(str(version)).set(count)
        return generate_latest(self.registry)


class RateTracker:
    """Rates of buffer-wide counters over the last ``window`` seconds, from the stats calls themselves."""

    def __init__(self, window: float = 30.0) -> None:
        self.window = window
        self.points: deque[tuple[float, int, int]] = deque()

    def update(self, ingested: int, served: int, now: float | None = None) -> dict[str, float]:
        now = time.monotonic() if now is None else now
        self.points.append((now, ingested, served))
        while len(self.points) > 2 and now - self.points[1][0] >= self.window:
            self.points.popleft()
        t0, i0, s0 = self.points[0]
        dt = now - t0
        if dt <= 0:
            return {"ingest_samples_per_s": 0.0, "sample_samples_per_s": 0.0}
        return {"ingest_samples_per_s": (ingested - i0) / dt, "sample_samples_per_s": (served - s0) / dt}
