"""Bounded exponential backoff with full jitter, for every client that retries."""

from __future__ import annotations

import random
from collections.abc import Iterator


def backoff_delays(base: float = 0.2, cap: float = 10.0, rng: random.Random | None = None) -> Iterator[float]:
    """Endless delays: uniform in [0, min(cap, base * 2**attempt)] (AWS 'full jitter')."""
    rng = rng or random.Random()
    attempt = 0
    while True:
        yield rng.uniform(0, min(cap, base * (2**attempt)))
        attempt = min(attempt + 1, 30)
