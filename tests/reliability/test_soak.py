"""Short form of the soak (reliability/soak.py, ``make soak``): 3.5 minutes instead of 30, same pass criteria.

``python -m reliability.soak --minutes 3.5`` on the test's own Redis (AOF on, as in production): a real
``tba buffer`` process, producers XADDing and POSTing valid groups, a client sampling back to back.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tba.redis_server import RedisServer
from tests.reliability.suites import run_suite
from tests.unit.buffer_factories import check_consistency

# Short, yet its warm-up (three 30 s windows) outlasts a dedup record's life (12 s + the global record's 60 s) and
# four windows are left to judge.
MINUTES = 3.5


@pytest.mark.slow
def test_minutes_of_load_leave_memory_flat_latency_stable_and_no_error(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    options = ("--minutes", MINUTES, "--redis-url", redis_server.url, "--workdir", tmp_path)
    result = run_suite("soak", *options, workdir=tmp_path, timeout=900)
    cfg = result["config"]
    assert cfg["minutes"] == MINUTES
    assert cfg["dedup_window_seconds"] + 60 < cfg["warmup_minutes"] * 60  # dedup records reach their bound early
    assert result["errors"] == []
    assert 0.9 * cfg["global_capacity"] <= result["final"]["samples"] <= cfg["global_capacity"]  # full, and capped
    assert result["final"]["samples_evicted"] > 0
    assert len(result["measured"]) >= 4 and all(w["requests"] > 0 for w in result["measured"])
    assert result["problems"] == [], "\n".join(result["problems"])
    check_consistency(redis_server.client())
