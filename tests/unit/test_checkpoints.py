"""The checkpoint protocol: atomic commit, hash verification, tamper detection, pruning with grace."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from tba.checkpoints import (
    CheckpointError,
    CheckpointStore,
    announce,
    content_hash,
    parse_manifest,
    step_name,
)
from tba.codec import PayloadError
from tba.keys import Keys
from tba.schemas import CheckpointManifest


def write_checkpoint(
    store: CheckpointStore, version: int, payload: bytes = b"weights", durable: bool = True
) -> CheckpointManifest:
    tmp = store.new_tmp_dir()
    (tmp / "model.safetensors").write_bytes(payload + str(version).encode())
    (tmp / "config.json").write_text(json.dumps({"v": version}))
    (tmp / "trainer").mkdir()
    (tmp / "trainer" / "optimizer.pt").write_bytes(b"adam")
    return store.commit(tmp, version=version, step=version, durable=durable)


def age(path: Path, seconds: float) -> None:
    t = time.time() - seconds
    os.utime(path, (t, t))


def test_commit_publishes_complete_directory_then_manifest(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path / "ckpt")
    assert store.read_manifest() is None and store.versions() == []
    m = write_checkpoint(store, 3)
    assert m.version == 3 and m.path == step_name(3) == "step-000003"
    assert store.read_manifest() == m
    assert store.verify(m) == store.step_dir(3)
    assert (store.step_dir(3) / "trainer" / "optimizer.pt").read_bytes() == b"adam"
    assert not list(store.root.glob(".tmp-*"))  # the work directory was renamed, the manifest replaced
    m4 = write_checkpoint(store, 4)
    assert store.read_manifest() == m4 and store.versions() == [3, 4]


def test_version_is_never_reused(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    first = write_checkpoint(store, 1)
    with pytest.raises(CheckpointError, match="already exists"):
        write_checkpoint(store, 1, b"other")
    assert store.verify(first) == store.step_dir(1)  # the published one is untouched


def test_tampering_is_detected(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    m = write_checkpoint(store, 1)
    weights = store.step_dir(1) / "model.safetensors"
    original = weights.read_bytes()
    weights.write_bytes(original[:-1] + b"X")
    with pytest.raises(CheckpointError, match="content hash"):
        store.verify(m)
    weights.write_bytes(original)
    store.verify(m)
    (store.step_dir(1) / "extra.bin").write_bytes(b"")
    with pytest.raises(CheckpointError, match="content hash"):
        store.verify(m)


def test_trainer_state_is_not_part_of_the_hash(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    m = write_checkpoint(store, 1)
    (store.step_dir(1) / "trainer" / "rng.pt").write_bytes(b"rng")
    assert content_hash(store.step_dir(1)) == m.content_hash
    store.verify(m)


def test_only_a_durable_commit_fsyncs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A durable commit fsyncs every file and directory it writes; a weights-only one none, and is as complete."""
    store = CheckpointStore(tmp_path)
    synced: list[str] = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(os.readlink(f"/proc/self/fd/{fd}")), real_fsync(fd)))
    light = write_checkpoint(store, 1, durable=False)
    assert synced == []
    assert store.read_manifest() == light and store.verify(light) == store.step_dir(1)
    heavy = write_checkpoint(store, 2)
    names = {Path(p).name for p in synced}
    assert {"model.safetensors", "config.json", "optimizer.pt", "manifest.json", "trainer"} <= names
    assert str(store.root) in synced, "the directory holding the renamed checkpoint and LATEST"
    assert any(name.startswith(".tmp-LATEST") for name in names), "LATEST before it replaces the old one"
    assert store.read_manifest() == heavy


def test_each_checkpoint_is_checked_against_its_own_manifest(tmp_path: Path) -> None:
    """What a resume relies on after a power loss: a torn checkpoint fails its own manifest's hash, a torn own
    manifest is an error too, and a damaged checkpoint set aside frees its version number."""
    store = CheckpointStore(tmp_path)
    m = write_checkpoint(store, 1, durable=False)
    assert store.verify_own(1) == m
    weights = store.step_dir(1) / "model.safetensors"
    size = weights.stat().st_size
    weights.write_bytes(b"\0" * size)  # what an unsynced file can come back as
    with pytest.raises(CheckpointError, match="content hash"):
        store.verify_own(1)
    own = store.step_dir(1) / "trainer" / "manifest.json"
    own.write_bytes(b"")
    with pytest.raises(CheckpointError, match="bad checkpoint manifest"):
        store.verify_own(1)
    own.unlink()  # a checkpoint from before own manifests: taken as it is
    assert store.verify_own(1).content_hash == content_hash(store.step_dir(1))

    aside = store.set_aside(1)
    assert aside.name.startswith("unusable-step-000001-") and store.versions() == []
    again = write_checkpoint(store, 1)
    assert store.verify_own(1) == again and (aside / "model.safetensors").read_bytes() == b"\0" * size
    store.prune(keep=0, grace_seconds=0, now=time.time() + 10)
    assert aside.is_dir(), "a set-aside checkpoint is left for the operator"


def test_missing_directory_and_hostile_manifest_paths(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path / "ckpt")
    m = write_checkpoint(store, 2)
    for bad in ["../outside", "/etc", "..", "a/b"]:
        with pytest.raises(CheckpointError, match="not a checkpoint directory name"):
            store.verify(m.model_copy(update={"path": bad}))
    with pytest.raises(CheckpointError, match="missing"):
        store.verify(m.model_copy(update={"path": step_name(9)}))


def test_bad_manifest_file(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    write_checkpoint(store, 1)
    store.manifest_path.write_text('{"version": 1}')
    with pytest.raises(PayloadError, match="bad checkpoint manifest"):
        store.read_manifest()
    with pytest.raises(PayloadError, match="schema_version"):
        parse_manifest(
            json.dumps({"schema_version": 5, "version": 1, "step": 1, "path": "step-000001", "content_hash": "0" * 64})
        )


def test_prune_keeps_newest_and_young_ones(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    for v in range(1, 6):
        write_checkpoint(store, v)
    for v in (1, 2, 3):
        age(store.step_dir(v), 600)
    age(store.step_dir(4), 600)
    assert store.prune(keep=2, grace_seconds=60) == [1, 2, 3]
    assert store.versions() == [4, 5]
    # a reader may still be loading a young checkpoint: the grace period protects it
    write_checkpoint(store, 6)
    assert store.prune(keep=1, grace_seconds=60) == [4]
    assert store.versions() == [5, 6]
    assert store.prune(keep=1, grace_seconds=0) == [5]
    assert store.versions() == [6]


def test_young_checkpoints_are_spared_only_up_to_the_bound_on_disk(tmp_path: Path) -> None:
    """One checkpoint per step, faster than the grace period: the oldest young ones go beyond the bound."""
    store = CheckpointStore(tmp_path)
    for v in range(1, 11):
        store.write_manifest(write_checkpoint(store, v))
    assert store.prune(keep=2, grace_seconds=60) == []  # no bound: a grace period's worth stays
    assert store.prune(keep=2, grace_seconds=60, max_on_disk=4) == [1, 2, 3, 4, 5, 6]
    assert store.versions() == [7, 8, 9, 10]
    assert store.prune(keep=3, grace_seconds=60, max_on_disk=1) == [7]  # never fewer than keep
    assert store.versions() == [8, 9, 10]


def test_prune_never_deletes_the_published_version(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    ms = [write_checkpoint(store, v) for v in (1, 2, 3)]
    store.write_manifest(ms[0])  # LATEST points at the oldest (e.g. a rollback)
    assert store.prune(keep=1, grace_seconds=0) == [2]
    assert store.versions() == [1, 3]
    store.verify(store.read_manifest())


def test_prune_removes_only_old_leftovers_of_crashed_writers(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    write_checkpoint(store, 1)
    old_dir, young_dir = store.new_tmp_dir(), store.new_tmp_dir()
    (old_dir / "model.safetensors").write_bytes(b"half")
    old_file = tmp_path / ".tmp-LATEST-dead"
    old_file.write_text("{")
    age(old_dir, 600)
    age(old_file, 600)
    store.prune(keep=3, grace_seconds=60)
    assert not old_dir.exists() and not old_file.exists()
    assert young_dir.exists()
    assert store.versions() == [1] and store.read_manifest().version == 1


def test_announce_sets_key_then_publishes(redis_server, tmp_path: Path) -> None:
    keys = Keys("t1")
    r = redis_server.client()
    pubsub = r.pubsub()
    pubsub.subscribe(keys.checkpoint_channel)
    assert pubsub.get_message(timeout=2)["type"] == "subscribe"
    m = write_checkpoint(CheckpointStore(tmp_path), 7)
    announce(r, keys, m)
    assert parse_manifest(r.get(keys.latest_manifest)) == m
    msg = pubsub.get_message(timeout=2)
    assert msg is not None and parse_manifest(msg["data"]) == m
    pubsub.close()
