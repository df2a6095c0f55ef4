"""Short form of the fuzz suite (reliability/fuzz.py, ``make fuzz``): same pass criteria, fewer cases.

``python -m reliability.fuzz`` on the test's own Redis (AOF on): a real ``tba buffer`` process with a
bearer token, the poison entries, and (the slow test) schemathesis against its OpenAPI document.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tba.redis_server import RedisServer
from tests.reliability.suites import run_suite
from tests.unit.buffer_factories import check_consistency

POISON_KINDS = 8  # the catalogue: bad msgpack, not a map, wrong schema version, missing fields, too large, ...


def _fuzz(redis_server: RedisServer, tmp_path: Path, *args: object) -> dict:
    common = ("--poison-repeats", 2, "--redis-url", redis_server.url, "--workdir", tmp_path / "fuzz")
    return run_suite("fuzz", *common, *args, workdir=tmp_path, timeout=900)


def test_poison_entries_are_dead_lettered_with_their_reason_and_the_ingest_goes_on(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    result = _fuzz(redis_server, tmp_path, "--max-examples", 0, "--min-cases", 0)
    poison = result["poison"]
    kinds = len(poison["outcomes"])
    assert result["problems"] == [] and result["schemathesis"] is None
    assert kinds >= POISON_KINDS
    assert [(o["name"], o["sent"], o["dead_lettered"], o["with_reason"]) for o in poison["outcomes"]] == [
        (o["name"], 2, 2, 2) for o in poison["outcomes"]
    ]
    stats = poison["stats"]
    assert stats["dead_letters"] == 2 * kinds and poison["valid_sent"] == 2 * kinds
    assert stats["groups_stored"] == poison["valid_sent"] and stats["samples"] == 4 * kinds
    assert stats["ingest"]["healthy"]
    assert result["buffer_ready_after"] and result["buffer_stopped_cleanly"]  # nothing left it stuck or dead
    check_consistency(redis_server.client())


@pytest.mark.slow
def test_schemathesis_finds_no_server_error_and_no_schema_violation(redis_server: RedisServer, tmp_path: Path) -> None:
    result = _fuzz(redis_server, tmp_path, "--max-examples", 30, "--min-cases", 300)
    st = result["schemathesis"]
    failures = "\n".join(
        f"{f['check']} on {f['operation']} ({f['count']}): {f['answer']}\n  {f['reproducer']}" for f in st["failures"]
    )
    assert st["failures"] == [], f"seed {st['seed']}:\n{failures}"
    assert st["errors"] == [] and not any(int(code) >= 500 for codes in st["responses"].values() for code in codes), st[
        "responses"
    ]
    assert st["cases"] >= 300, f"only {st['cases']} cases"
    assert set(st["responses"]) >= {"POST /v1/sample", "POST /v1/groups", "GET /v1/stats", "GET /metrics"}
    assert st["responses"]["POST /v1/sample"]["200"] > 0, "no sample request was ever answered: the draw went untested"
    assert st["responses"]["POST /v1/groups"]["200"] > 0, "no fuzzed group was ever stored: the write went untested"
    assert result["problems"] == [] and result["buffer_ready_after"] and result["buffer_stopped_cleanly"]
    check_consistency(redis_server.client())
