"""`tba searcher` as a real process: health endpoints while loading and running, a late joiner that
starts from the newest checkpoint, an announced reload, and SIGTERM -> clean exit 0 with nothing
left behind (no engine process, nothing unpublished)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from tba.checkpoints import CheckpointStore, announce
from tba.codec import decode
from tba.health import free_port
from tba.keys import STREAM_FIELD, Keys
from tba.local.commands import tba_command
from tba.model.tiny import init_model
from tba.process_tree import alive, command_line, descendants
from tba.schemas import ScoredGroup
from tests.waiting import wait_while_running

pytestmark = [pytest.mark.slow, pytest.mark.vllm]

KEYS = Keys("proc")


def publish_checkpoint(store: CheckpointStore, redis_client, version: int) -> None:
    tmp = store.new_tmp_dir()
    init_model(tmp, seed=version)
    announce(redis_client, KEYS, store.commit(tmp, version=version, step=version))


def get(url: str) -> httpx.Response | None:
    try:
        return httpx.get(url, timeout=10.0)
    except httpx.HTTPError:
        return None


def test_process_lifecycle(redis_server, tiny_model: Path, tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path / "ckpt")
    client = redis_server.client()
    publish_checkpoint(store, client, 5)  # published before the searcher starts
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    env = {
        **os.environ,
        "TBA_MODEL": str(tiny_model),
        "TBA_REDIS_URL": redis_server.url,
        "TBA_NAMESPACE": "proc",
        "TBA_CHECKPOINT_DIR": str(store.root),
        "TBA_SPILL_DIR": str(tmp_path / "spill"),
        "TBA_METRICS_PORT": str(port),
        "TBA_SEARCHER_ID": "proc-0",
        "TBA_PROMPTS_PER_BATCH": "4",
        "TBA_COMPLETIONS_PER_PROMPT": "4",
        "TBA_MAX_NEW_TOKENS": "8",
        "TBA_MAX_MODEL_LEN": "64",
        "TBA_RELOAD_POLL_SECONDS": "1",
    }
    log = tmp_path / "searcher.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            tba_command("searcher"),
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        first = wait_while_running("/healthz", lambda: get(f"{base}/healthz"), 60, proc, log)
        assert first.status_code == 200
        early = get(f"{base}/readyz")
        assert early.status_code == 503 and "loading" in early.text  # alive, not ready while the engine loads
        wait_while_running("/readyz", lambda: (r := get(f"{base}/readyz")) and r.status_code == 200, 300, proc, log)
        status = wait_while_running(
            "8 groups published",
            lambda: (s := get(f"{base}/status").json())["groups_published"] >= 8 and s,
            120,
            proc,
            log,
        )
        assert status["searcher_id"] == "proc-0" and status["version"] == 5  # late joiner caught up at start
        assert status["reloads"] == 1 and status["state"] == "running" and status["redis_up"] == 1
        for field in ("samples_per_s", "tokens_per_s", "reload_ms_last", "spilled", "samples_published"):
            assert field in status
        metrics = get(f"{base}/metrics").text
        assert "tba_searcher_version 5.0" in metrics and "tba_searcher_reload_seconds_bucket" in metrics

        publish_checkpoint(store, client, 6)  # announced while it runs: reloaded in place
        status = wait_while_running(
            "the reload to v6", lambda: (s := get(f"{base}/status").json())["version"] == 6 and s, 60, proc, log
        )
        assert status["reloads"] == 2 and status["reload_ms_last"] > 0
        wait_while_running(
            "groups of v6",
            lambda: get(f"{base}/status").json()["groups_published"] > status["groups_published"] + 4,
            60,
            proc,
            log,
        )

        children = descendants(proc.pid)
        assert children, "vLLM's engine core runs in child processes"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=120) == 0
        # multiprocessing's resource tracker exits just after its parent: give the tree a moment.
        deadline = time.monotonic() + 15
        while [pid for pid in children if alive(pid)] and time.monotonic() < deadline:
            time.sleep(0.2)
        left = {pid: command_line(pid) for pid in children if alive(pid)}
        assert not left, f"processes left behind: {left}"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    text = log.read_text()
    assert "stopping after the current batch" in text
    # No failure of ours. (A probe that gave up on a starved health thread may leave a BrokenPipe
    # traceback from http.server: that is the prober's side, not the searcher's.)
    tracebacks = text.split("Traceback (most recent call last)")[1:]
    assert not [t for t in tracebacks if "services/searcher" in t[:3000]], tracebacks
    assert " ERROR services.searcher" not in text
    stopped = json.loads(text.split("stopped: ")[-1].splitlines()[0])
    groups = [decode(f[STREAM_FIELD.encode()], ScoredGroup) for _id, f in client.xrange(KEYS.trajectories)]
    assert len(groups) == stopped["groups_published"] == stopped["groups_generated"]  # nothing left unpublished
    assert {g.policy_version for g in groups} == {5, 6} and {g.searcher_id for g in groups} == {"proc-0"}
    assert not list((tmp_path / "spill").glob("*.msgpack"))
