"""Short form of the security suite (reliability/security.py, ``make security``): the same checks, fewer timed
requests. A real Redis that requires a password and real ``tba buffer`` processes with a bearer token."""

from __future__ import annotations

from pathlib import Path

from reliability.security import SecurityResult, check_containers, leaks, security


def test_token_redis_password_secrets_and_containers(tmp_path: Path) -> None:
    result = security(tmp_path, timed_requests=20, local_run=False)  # tests/e2e/test_local_run.py searches a run
    failed = [f"{c.what}: {c.detail}" for c in result.checks if not c.passed]
    assert failed == []
    names = " | ".join(c.what for c in result.checks)
    for expected in (
        "with no Authorization header",
        "with a prefix of the token",
        "with the token",
        "Redis with no password",
        "Redis with a wrong password",
        "with the password: ready",
        "no secret in logs",
        "docker-compose.yml",
        "Dockerfiles",
        "Kubernetes",
    ):
        assert expected in names, names
    assert set(result.timing_us) == {"near", "far"}


def test_the_leak_search_finds_a_secret_where_it_is(tmp_path: Path) -> None:
    """The search the suite relies on: a secret in an answer or a file is reported, with where."""
    log = tmp_path / "x.log"
    log.write_text("connecting to redis://:hunter2hunter2@redis:6379\n")
    found = leaks({"password": "hunter2hunter2", "token": "tok-123456"}, ["ok", "Bearer tok-123456"], [log])
    assert found == ["token in answer 1: 'Bearer tok-123456'", f"password in {log}"]


def test_the_container_checks_pass_on_the_repository() -> None:
    result = SecurityResult()
    check_containers(result)
    assert [c.passed for c in result.checks] == [True, True, True], result.checks
