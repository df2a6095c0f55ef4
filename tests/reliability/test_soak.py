"""Short form of the soak (reliability/soak.py, ``make soak``): 5 minutes instead of 30, same pass criteria.

A real ``tba buffer`` process on the test's own Redis (AOF on, as in production), producers XADDing
and POSTing valid groups, a client sampling back to back.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from reliability.soak import config_for, soak
from tests.conftest import RedisServer
from tests.unit.buffer_factories import check_consistency


@pytest.mark.slow
def test_five_minutes_of_load_leave_memory_flat_latency_stable_and_no_error(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    cfg = config_for(5.0)
    assert cfg.dedup_window_seconds + 60 < cfg.warmup_minutes * 60  # dedup records reach their bound in the warm-up
    result = soak(cfg, redis_server.url, tmp_path)
    assert result.errors() == []
    assert 0.9 * cfg.global_capacity <= result.final["samples"] <= cfg.global_capacity  # full, and capped
    assert result.final["samples_evicted"] > 0
    assert len(result.measured) >= 5 and all(w.requests > 0 for w in result.measured)
    assert result.problems() == [], "\n".join(result.problems())
    check_consistency(redis_server.client())
