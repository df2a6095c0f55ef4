"""Short form of the security suite (reliability/security.py, ``make security``): the same checks, fewer timed
requests. A real Redis that requires a password and real ``tba buffer`` processes with a bearer token; the
search of a whole ``tba up`` run's directory is tests/e2e/test_local_run.py's (``--no-local-run`` here)."""

from __future__ import annotations

from pathlib import Path

from tests.reliability.suites import run_suite


def test_token_redis_password_secrets_and_containers(tmp_path: Path) -> None:
    result = run_suite("security", "--timed-requests", 20, "--no-local-run", workdir=tmp_path, timeout=600)
    failed = [f"{c['what']}: {c['detail']}" for c in result["checks"] if not c["passed"]]
    assert failed == [] and result["passed"]
    names = " | ".join(c["what"] for c in result["checks"])
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
    assert "no secret in a whole `tba up` run directory" not in names  # --no-local-run was honoured
    assert set(result["timing_us"]) == {"near", "far"} and result["timed_requests"] == 20
