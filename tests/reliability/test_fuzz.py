"""Short form of the fuzz suite (reliability/fuzz.py, ``make fuzz``): same pass criteria, fewer cases.

A real ``tba buffer`` process on the test's own Redis (AOF on), with a bearer token.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from pathlib import Path

import pytest

from reliability.fuzz import (
    MAX_FUZZ_WAIT_SECONDS,
    MAX_PAYLOAD_BYTES,
    poison_catalogue,
    run_poison,
    run_schemathesis,
    seed_buffer,
)
from reliability.services import BufferProcess
from tests.conftest import RedisServer
from tests.unit.buffer_factories import check_consistency


@pytest.fixture
def buffer(redis_server: RedisServer, tmp_path: Path) -> Iterator[BufferProcess]:
    proc = BufferProcess(
        redis_server.url,
        tmp_path / "buffer.log",
        token=secrets.token_hex(16),
        consumer_name="fuzz",
        max_payload_bytes=MAX_PAYLOAD_BYTES,
        ingest_block_ms=50,
        max_sample_wait_seconds=MAX_FUZZ_WAIT_SECONDS,
    ).start()
    yield proc
    assert proc.stop(), proc.log_tail()  # a graceful exit: nothing the fuzzing did left it stuck or dead


def test_poison_entries_are_dead_lettered_with_their_reason_and_the_ingest_goes_on(
    buffer: BufferProcess, redis_server: RedisServer
) -> None:
    result = run_poison(buffer, redis_server.url, repeats=2)
    kinds = len(poison_catalogue())
    assert result.problems == []
    assert [(o.name, o.dead_lettered, o.with_reason) for o in result.outcomes] == [
        (o.name, 2, 2) for o in result.outcomes
    ]
    assert result.stats["dead_letters"] == 2 * kinds and result.valid_sent == 2 * kinds
    assert result.stats["groups_stored"] == result.valid_sent and result.stats["samples"] == 4 * kinds
    assert result.stats["ingest"]["healthy"] and buffer.ready()
    check_consistency(redis_server.client())


@pytest.mark.slow
def test_schemathesis_finds_no_server_error_and_no_schema_violation(
    buffer: BufferProcess, redis_server: RedisServer, tmp_path: Path
) -> None:
    seed_buffer(buffer)
    result = run_schemathesis(buffer, tmp_path / "fuzz", max_examples=30, seed=None, timeout=600)
    failures = "\n".join(
        f"{f.check} on {f.operation} ({f.count}): {f.answer}\n  {f.reproducer}" for f in result.failures
    )
    assert result.failures == [], f"seed {result.seed}:\n{failures}"
    assert result.server_errors == 0 and result.errors == []
    assert result.cases >= 300, f"only {result.cases} cases"
    assert set(result.responses) >= {"POST /v1/sample", "POST /v1/groups", "GET /v1/stats", "GET /metrics"}
    assert result.responses["POST /v1/sample"][200] > 0, "no sample request was ever answered: the draw went untested"
    assert result.responses["POST /v1/groups"][200] > 0, "no fuzzed group was ever stored: the write went untested"
    assert buffer.alive() and buffer.ready()
    check_consistency(redis_server.client())
