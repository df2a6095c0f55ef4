"""The project's one redis-server launcher (tba/redis_server.py), on the real binary: it answers before
``start()`` returns, keeps what reached its AOF across a kill, takes any password without showing it on a
command line, stops a server that will not stop by itself, says clearly why a server did not start, and
dies with the process that started it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis

from tba.process_tree import alive, command_line
from tba.redis_server import RedisServer, RedisServerError
from tests.waiting import gone_within


def test_it_answers_once_started_and_keeps_what_reached_its_aof_across_a_kill(tmp_path: Path) -> None:
    server = RedisServer(tmp_path / "redis").start()
    try:
        client = server.client()
        client.set("k", "v")
        time.sleep(1.2)  # appendfsync everysec: a second later the write is on disk
        port, pid = server.port, server.pid
        server.stop(kill=True)
        assert not alive(pid)
        server.start()
        assert server.port == port and server.pid != pid
        assert server.client().get("k") == b"v"
        assert (tmp_path / "redis" / "redis.log").stat().st_size > 0
    finally:
        server.stop()


def test_any_password_is_required_and_never_on_the_command_line(tmp_path: Path) -> None:
    password = 'a "quoted" pass\\word with spaces @/:'
    with RedisServer(tmp_path / "redis", password=password) as server:
        assert redis.Redis.from_url(server.url).ping()
        for refused in (server.url_with("wrong"), server.url_without_password):
            with pytest.raises(redis.AuthenticationError):
                redis.Redis.from_url(refused).ping()
        assert password not in command_line(server.pid) and "requirepass" not in command_line(server.pid)


def test_a_server_that_does_not_stop_on_sigterm_is_killed(tmp_path: Path) -> None:
    server = RedisServer(tmp_path / "redis", appendonly=False).start()
    pid = server.pid
    os.kill(pid, signal.SIGSTOP)  # a stopped process leaves SIGTERM pending
    started = time.monotonic()
    server.stop(timeout=0.5)
    assert not alive(pid) and time.monotonic() - started < 5
    server.stop()  # stopping a stopped server does nothing


def test_a_server_that_cannot_start_fails_at_once_with_its_log(tmp_path: Path) -> None:
    with RedisServer(tmp_path / "first", appendonly=False) as first:
        second = RedisServer(tmp_path / "second", appendonly=False)
        second.port = first.port  # taken
        started = time.monotonic()
        with pytest.raises(RedisServerError, match=f"exited with 1 before answering on port {first.port}") as err:
            second.start()
        assert time.monotonic() - started < 5  # not the whole start timeout
        assert "the end of its log" in str(err.value) and "Address already in use" in str(err.value)
        assert not second.alive()


def test_no_redis_server_on_path_names_the_package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(RedisServerError, match="apt-get install -y redis-server"):
        RedisServer(tmp_path / "redis").start()


def test_an_empty_password_is_refused() -> None:
    with pytest.raises(ValueError, match="cannot be empty"):
        RedisServer("/nonexistent", password="")


def test_the_server_dies_with_the_process_that_started_it(tmp_path: Path) -> None:
    parent = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time\n"
            "from tba.redis_server import RedisServer\n"
            "server = RedisServer(sys.argv[1], appendonly=False).start()\n"
            "print(server.pid, flush=True)\n"
            "time.sleep(120)\n",
            str(tmp_path / "redis"),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert parent.stdout is not None
    pid = int(parent.stdout.readline())
    try:
        assert alive(pid) and "redis-server" in command_line(pid)
        parent.kill()
        parent.wait(10)
        assert gone_within(pid, 5), "the redis-server outlived the process that started it"
    finally:
        parent.kill()
        if alive(pid):
            os.kill(pid, signal.SIGKILL)
