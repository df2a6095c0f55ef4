"""The checkpoint watcher against a real redis-server and a real checkpoint root: the announcement,
the key and LATEST fallbacks, refusing a checkpoint whose hash does not match, skipping to the newest,
and catching up after Redis restarts."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from services.searcher.watcher import CheckpointWatcher
from tba.checkpoints import CheckpointStore, announce
from tba.keys import Keys
from tba.redis_client import sync_client

KEYS = Keys("t")


def commit(store: CheckpointStore, version: int, content: bytes | None = None):
    tmp = store.new_tmp_dir()
    (tmp / "model.safetensors").write_bytes(content or f"weights v{version}".encode())
    (tmp / "config.json").write_text("{}")
    return store.commit(tmp, version=version, step=version)


def wait_for(predicate, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.02)


@pytest.fixture
def store(tmp_path: Path) -> CheckpointStore:
    return CheckpointStore(tmp_path / "ckpt")


def watcher(redis_server, store: CheckpointStore, poll: float = 60.0, version: int = 0) -> CheckpointWatcher:
    return CheckpointWatcher(
        lambda: sync_client(redis_server.url, timeout=0.5, retry=False), KEYS, store, poll, current_version=version
    )


def test_announcement_wakes_the_watcher(redis_server, store) -> None:
    m = commit(store, 1)
    store.manifest_path.unlink()  # neither in LATEST nor in the key: the message is the only source
    w = watcher(redis_server, store).start()  # long poll period: only pub/sub can deliver in time
    try:
        wait_for(lambda: redis_server.client().pubsub_numsub(KEYS.checkpoint_channel)[0][1] == 1)
        assert w.ready_version is None
        redis_server.client().publish(KEYS.checkpoint_channel, m.model_dump_json())
        wait_for(lambda: w.ready_version == 1)
        ckpt = w.take()
        assert ckpt.version == 1 and ckpt.path == store.step_dir(1)
        assert w.take() is None  # handed out once
    finally:
        w.stop()


def test_a_paced_searcher_waiting_for_a_policy_wakes_when_it_is_verified(redis_server, store) -> None:
    """wait_ready blocks while nothing newer is verified and returns as soon as an announced checkpoint is,
    well before its timeout; once taken, it blocks again."""
    w = watcher(redis_server, store).start()
    try:
        wait_for(lambda: redis_server.client().pubsub_numsub(KEYS.checkpoint_channel)[0][1] == 1)
        assert w.wait_ready(0.2) is False
        m = commit(store, 1)
        store.manifest_path.unlink()
        redis_server.client().publish(KEYS.checkpoint_channel, m.model_dump_json())
        started = time.monotonic()
        assert w.wait_ready(30.0) is True
        assert time.monotonic() - started < 25.0, "woken by the verified checkpoint, not by the timeout"
        assert w.take().version == 1
        assert w.wait_ready(0.1) is False
    finally:
        w.stop()


def test_late_joiner_finds_the_key(redis_server, store) -> None:
    m = commit(store, 3)
    store.manifest_path.unlink()
    announce(redis_server.client(), KEYS, m)  # announced before the watcher existed
    w = watcher(redis_server, store)
    w.poll_once()
    assert w.take().version == 3


def test_latest_file_is_the_fallback_without_redis(redis_server, store) -> None:
    commit(store, 2)
    redis_server.stop(kill=True)
    w = watcher(redis_server, store, poll=0.1).start()
    try:
        wait_for(lambda: w.ready_version == 2)
    finally:
        w.stop()


def test_hash_mismatch_is_refused_and_the_version_kept(redis_server, store) -> None:
    m = commit(store, 1)
    (store.step_dir(1) / "model.safetensors").write_bytes(b"half-written or tampered")
    announce(redis_server.client(), KEYS, m)
    w = watcher(redis_server, store)
    w.poll_once()
    w.poll_once()  # refused once, not re-hashed on every poll
    assert w.take() is None and w.rejected == 1 and w.current_version == 0
    announce(redis_server.client(), KEYS, commit(store, 2))  # a good, newer one still gets through
    w.poll_once()
    assert w.take().version == 2


def test_missing_directory_is_retried(redis_server, store) -> None:
    m = commit(store, 1)
    hidden = store.step_dir(1).rename(store.root / "elsewhere")  # not visible yet on shared storage
    w = watcher(redis_server, store)
    w.poll_once()
    assert w.take() is None and w.rejected == 0
    hidden.rename(store.step_dir(1))
    w.poll_once()
    assert w.take().manifest == m


def test_skips_straight_to_the_newest(redis_server, store) -> None:
    w = watcher(redis_server, store).start()
    try:
        wait_for(lambda: redis_server.client().pubsub_numsub(KEYS.checkpoint_channel)[0][1] == 1)
        for v in (1, 2, 3):
            announce(redis_server.client(), KEYS, commit(store, v))
        wait_for(lambda: w.ready_version == 3)
        assert w.take().version == 3 and w.take() is None
        w.current_version = 3
        announce(redis_server.client(), KEYS, commit(store, 4))
        wait_for(lambda: w.ready_version == 4)
        assert w.newest_seen == 4
    finally:
        w.stop()


def test_older_versions_are_ignored(redis_server, store) -> None:
    announce(redis_server.client(), KEYS, commit(store, 1))
    w = watcher(redis_server, store, version=5)
    w.poll_once()
    assert w.take() is None and w.rejected == 0


def test_resubscribes_after_redis_restart(redis_server, store) -> None:
    m = commit(store, 7)
    store.manifest_path.unlink()
    w = watcher(redis_server, store, poll=60.0).start()
    try:
        client = redis_server.client()
        wait_for(lambda: client.pubsub_numsub(KEYS.checkpoint_channel)[0][1] == 1)
        redis_server.stop(kill=True)
        redis_server.start()
        client = redis_server.client()
        wait_for(lambda: client.pubsub_numsub(KEYS.checkpoint_channel)[0][1] == 1, timeout=30)
        assert w.ready_version is None
        client.publish(KEYS.checkpoint_channel, m.model_dump_json())
        wait_for(lambda: w.ready_version == 7)
    finally:
        w.stop()
