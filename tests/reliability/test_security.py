"""Short form of the security suite (reliability/security.py, ``make security``): the same checks, fewer timed
requests. A real Redis that requires a password and real ``tba buffer`` processes with a bearer token."""

from __future__ import annotations

from pathlib import Path

from reliability.security import SecurityResult, check_containers, security


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


def test_the_container_checks_pass_on_the_repository() -> None:
    result = SecurityResult()
    check_containers(result)
    assert [c.passed for c in result.checks] == [True, True, True], result.checks
