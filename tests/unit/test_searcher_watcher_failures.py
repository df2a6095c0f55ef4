"""The checkpoint watcher survives every failure injected into it, on real checkpoint directories, with Redis
down (a client aimed at a port nothing listens on, so the watcher reads the LATEST file): files vanishing while
they are hashed, a manifest that does not parse or names a path outside the root, an I/O error, an exception
of a kind nothing expects. Each is logged and counted where it is an error, the thread stays alive, and the
next good checkpoint is still taken."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest

import tba.checkpoints
from services.searcher.watcher import CheckpointWatcher
from tba.checkpoints import CheckpointStore, content_hash
from tba.keys import Keys
from tba.redis_client import sync_client
from tba.schemas import CheckpointManifest

NOBODY = "redis://127.0.0.1:1/0"  # nothing listens on port 1: every Redis call fails at once


def commit(store: CheckpointStore, version: int) -> CheckpointManifest:
    tmp = store.new_tmp_dir()
    (tmp / "model.safetensors").write_bytes(f"weights v{version}".encode() * 1000)
    (tmp / "config.json").write_text("{}")
    return store.commit(tmp, version=version, step=version, durable=False)


def watcher(store: CheckpointStore, poll: float = 0.05) -> CheckpointWatcher:
    return CheckpointWatcher(lambda: sync_client(NOBODY, timeout=0.2, retry=False), Keys("t"), store, poll)


def wait_for(predicate, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.02)


@pytest.fixture
def store(tmp_path: Path) -> CheckpointStore:
    return CheckpointStore(tmp_path / "ckpt")


def pruned_while_hashing(monkeypatch: pytest.MonkeyPatch, victim: Path, then=lambda: None) -> None:
    """The trainer deletes ``victim`` after the first of its files is hashed (then does ``then``): the hash's
    next open of a file fails with FileNotFoundError, as when a fast trainer prunes under a slow reader."""

    def hash_and_prune(directory: Path) -> str:
        if directory != victim:
            return content_hash(directory)
        files = sorted(p for p in directory.iterdir() if p.is_file())
        files[0].read_bytes()
        shutil.rmtree(directory)
        then()
        for path in files[1:]:
            path.read_bytes()  # FileNotFoundError
        raise AssertionError("unreachable: the directory is gone")

    monkeypatch.setattr(tba.checkpoints, "content_hash", hash_and_prune)


def test_files_vanishing_mid_hash_skip_to_the_newest_announced(store, monkeypatch) -> None:
    old = commit(store, 1)
    pruned_while_hashing(monkeypatch, store.step_dir(1))
    w = watcher(store)
    newest = commit(store, 2)
    w._heard(newest)  # v2 already announced when v1's turn comes
    w.consider(old, "announcement")  # no exception: v1 is gone, v2 taken instead
    assert w.vanished == 1 and w.errors == 0 and w.rejected == 0
    assert w.take().version == 2


def test_the_thread_survives_a_checkpoint_pruned_mid_hash_and_takes_the_next(store, monkeypatch) -> None:
    first = commit(store, 1)
    # While v1 is hashed the trainer publishes v2 (LATEST) and prunes v1.
    pruned_while_hashing(monkeypatch, store.step_dir(first.version), then=lambda: commit(store, 2))
    w = watcher(store).start()
    try:
        wait_for(lambda: w.ready_version == 2)
        assert w.alive and w.errors == 0 and w.rejected == 0
    finally:
        w.stop()


def test_a_latest_file_that_does_not_parse_is_skipped(store) -> None:
    store.root.mkdir(parents=True)
    store.manifest_path.write_text("{not json")
    w = watcher(store).start()
    try:
        time.sleep(0.3)  # several polls of the bad file
        assert w.alive and w.ready_version is None
        commit(store, 3)  # a good one replaces it
        wait_for(lambda: w.ready_version == 3)
    finally:
        w.stop()


def test_a_manifest_naming_a_path_outside_the_root_is_refused_for_good(store) -> None:
    good = commit(store, 1)
    bad = good.model_copy(update={"version": 2, "path": "../elsewhere"})
    w = watcher(store)
    w.consider(bad, "announcement")
    w.consider(bad, "announcement")
    assert w.rejected == 1 and w.take() is None


def test_redis_down_leaves_the_latest_file_and_no_lease(store) -> None:
    commit(store, 4)
    w = watcher(store).start()
    try:
        wait_for(lambda: w.ready_version == 4)
        assert w.alive and w.errors == 0 and w.leases.held == set()  # no lease without Redis
    finally:
        w.stop()


def test_an_unexpected_exception_is_counted_and_the_watcher_goes_on(store, monkeypatch) -> None:
    commit(store, 5)
    calls = {"n": 0}
    verify = CheckpointStore.verify

    def failing_twice(self, manifest):
        calls["n"] += 1
        if calls["n"] <= 2:
            raise RuntimeError("injected")
        return verify(self, manifest)

    monkeypatch.setattr(CheckpointStore, "verify", failing_twice)
    w = watcher(store).start()
    try:
        wait_for(lambda: w.ready_version == 5)
        assert w.alive and w.errors == 2 and w.last_error == "RuntimeError: injected"
    finally:
        w.stop()


def test_an_io_error_on_a_checkpoint_that_is_there_is_counted_and_retried(store, monkeypatch) -> None:
    commit(store, 6)
    failures = {"left": 1}

    def flaky(directory: Path) -> str:
        if failures["left"]:
            failures["left"] -= 1
            raise PermissionError(13, "Permission denied", str(directory / "model.safetensors"))
        return content_hash(directory)

    monkeypatch.setattr(tba.checkpoints, "content_hash", flaky)
    w = watcher(store)
    w.poll_once()  # never raises: the error is counted and nothing refused
    assert w.errors == 1 and w.rejected == 0 and w.ready_version is None
    w.poll_once()
    assert w.take().version == 6


def test_a_pass_that_raises_is_counted_and_retried_after_a_backoff(store, monkeypatch) -> None:
    commit(store, 7)
    w = watcher(store)
    poll, raised = w.poll_once, []

    def broken_twice() -> None:
        if len(raised) < 2:
            raised.append(time.monotonic())
            raise OSError(5, "Input/output error")
        poll()

    monkeypatch.setattr(w, "poll_once", broken_twice)
    w.start()
    try:
        wait_for(lambda: w.ready_version == 7, timeout=30)
        assert w.alive and w.errors == 2 and "Input/output error" in (w.last_error or "")
    finally:
        w.stop()
