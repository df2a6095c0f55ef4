"""The secret search (tba/leaks.py) the security suite and the end-to-end tests rely on: a secret in an
answer or a file is reported, with where; a file or answer without one is not."""

from __future__ import annotations

from pathlib import Path

from tba.leaks import files_under, leaks


def test_a_secret_is_found_where_it_is_and_nowhere_else(tmp_path: Path) -> None:
    (tmp_path / "logs").mkdir()
    log = tmp_path / "logs" / "x.log"
    log.write_text("connecting to redis://:hunter2hunter2@redis:6379\n")
    (tmp_path / "clean.bin").write_bytes(b"\x00\x01 nothing here")
    files = files_under(tmp_path)
    assert files == [tmp_path / "clean.bin", log]
    found = leaks({"password": "hunter2hunter2", "token": "tok-123456"}, ["ok", "Bearer tok-123456"], files)
    assert found == ["token in answer 1: 'Bearer tok-123456'", f"password in {log}"]
