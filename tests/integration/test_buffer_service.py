"""`tba buffer` as a real process: killed between read and ack, another replica finishes; SIGTERM; bad flags."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from tba.codec import encode
from tba.health import free_port
from tba.keys import STREAM_FIELD, Keys
from tba.local.commands import tba_command
from tests.unit.buffer_factories import check_consistency, make_group

K = Keys()
ROOT = Path(__file__).resolve().parents[2]


def start_buffer(redis_url: str, consumer: str, log: Path, **env: str) -> tuple[subprocess.Popen, str]:
    port = free_port()
    full_env = {
        **os.environ,
        "TBA_REDIS_URL": redis_url,
        "TBA_PORT": str(port),
        "TBA_CONSUMER_NAME": consumer,
        **{f"TBA_{k.upper()}": v for k, v in env.items()},
    }
    proc = subprocess.Popen(
        tba_command("buffer"),
        cwd=ROOT,
        env=full_env,
        stdout=log.open("w"),
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        assert proc.poll() is None, log.read_text()
        try:
            if httpx.get(f"{url}/readyz", timeout=1).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    proc.kill()
    raise AssertionError(f"buffer did not become ready:\n{log.read_text()}")


def wait_for(cond, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.05)
    raise AssertionError("condition not met in time")


@pytest.mark.slow
def test_killed_between_read_and_ack_loses_nothing_and_duplicates_nothing(redis_server, tmp_path) -> None:
    sync = redis_server.client()
    n_groups, n_held = 3000, 200
    pipe = sync.pipeline(transaction=False)
    for i in range(n_groups):
        pipe.xadd(
            K.trajectories,
            {STREAM_FIELD: encode(make_group(f"p{i % 500}", version=i // 1000, rewards=[0.0, 1.0, 2.0, 3.0]))},
        )
    pipe.execute()
    # A replica that read a batch and died before its store-and-ack call leaves exactly this state
    # (storing and acking are one atomic Lua call): entries pending under its name, nothing stored.
    sync.xgroup_create(K.trajectories, K.ingest_group, id="0")
    held = sync.xreadgroup(K.ingest_group, "replica-dead", {K.trajectories: ">"}, count=n_held)
    assert len(held[0][1]) == n_held
    # A real replica, SIGKILLed at an arbitrary moment mid-ingest (frozen first, to make it likelier
    # it holds a batch of its own between read and ack; the outcome must not depend on whether it does).
    a, _ = start_buffer(redis_server.url, "replica-a", tmp_path / "a.log", ingest_batch="50")
    try:
        wait_for(lambda: int(sync.hget(K.global_key("stats"), "groups_ingested") or 0) > 0)
        a.send_signal(signal.SIGSTOP)
        a.kill()
        a.wait(10)
    finally:
        if a.poll() is None:
            a.kill()
    assert sync.xpending(K.trajectories, K.ingest_group)["pending"] >= n_held
    stored_at_kill = int(sync.hget(K.global_key("stats"), "groups_ingested"))
    assert stored_at_kill <= n_groups - n_held
    b, url = start_buffer(redis_server.url, "replica-b", tmp_path / "b.log", claim_idle_ms="200")
    try:
        wait_for(
            lambda: (
                int(sync.hget(K.global_key("stats"), "groups_ingested") or 0) >= n_groups
                and sync.xpending(K.trajectories, K.ingest_group)["pending"] == 0
            )
        )
        stats = httpx.get(f"{url}/v1/stats").json()
        assert stats["samples"] == 4 * n_groups and stats["groups_stored"] == n_groups
        assert stats["samples_duplicate"] == 0 and stats["groups_duplicate"] == 0 and stats["dead_letters"] == 0
        check_consistency(sync)
        b.send_signal(signal.SIGTERM)  # graceful: lifespan stops ingest and closes Redis
        b.wait(20)
        assert "buffer stopped" in (tmp_path / "b.log").read_text()
    finally:
        if b.poll() is None:
            b.kill()


def test_bad_settings_stop_the_service_with_a_message_naming_the_variable(redis_server) -> None:
    r = subprocess.run(
        tba_command("buffer", "--per-prompt-capacity", "zero"),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "TBA_REDIS_URL": redis_server.url},
    )
    assert r.returncode == 2
    assert "TBA_PER_PROMPT_CAPACITY / --per-prompt-capacity" in r.stderr and "'zero'" in r.stderr


def test_a_client_leaving_mid_body_costs_one_log_line_not_a_traceback(redis_server, tmp_path) -> None:
    """A producer killed while sending: the buffer logs one line and serves the next request."""
    import socket

    log = tmp_path / "buffer.log"
    proc, url = start_buffer(redis_server.url, "c0", log)
    try:
        port = int(url.rsplit(":", 1)[1])
        for _ in range(3):
            with socket.create_connection(("127.0.0.1", port)) as sock:
                sock.sendall(
                    b"POST /v1/groups HTTP/1.1\r\nHost: x\r\nContent-Type: application/msgpack\r\n"
                    b"Content-Length: 100000\r\n\r\n" + b"\x00" * 1000
                )
        wait_for(lambda: log.read_text().count("went away after") == 3, timeout=10)
        r = httpx.post(
            f"{url}/v1/groups", content=encode(make_group("after")), headers={"Content-Type": "application/msgpack"}
        )
        assert r.status_code == 200, r.text
        text = log.read_text()
        assert "Traceback" not in text and "Exception in ASGI application" not in text, text
        assert "the client (127.0.0.1) went away after 1000 bytes of the body" in text
    finally:
        proc.terminate()
        proc.wait(15)
