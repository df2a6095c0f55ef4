"""Leases on checkpoints against a real redis-server and a real checkpoint root: the trainer's pruning spares
what a searcher holds, whatever the retention; a lease that expires (a searcher that died) frees it; a lease
cannot be taken on a checkpoint being deleted; and while the leases cannot be read, nothing is deleted."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import redis

from services.searcher.leases import Lease, LeaseKeeper
from services.trainer.loop import Trainer
from tba.checkpoint_leases import CheckpointLeases
from tba.checkpoints import CheckpointStore, step_name
from tba.keys import Keys
from tba.settings import TrainerSettings

KEYS = Keys("t")


def commit(store: CheckpointStore, version: int) -> None:
    tmp = store.new_tmp_dir()
    (tmp / "model.safetensors").write_bytes(f"weights v{version}".encode())
    (tmp / "config.json").write_text("{}")
    store.commit(tmp, version=version, step=version, durable=False)


@pytest.fixture
def store(tmp_path: Path) -> CheckpointStore:
    store = CheckpointStore(tmp_path / "ckpt")
    for version in range(1, 6):
        commit(store, version)
    return store


def test_pruning_spares_every_leased_checkpoint_whatever_the_retention(redis_server, store) -> None:
    leases = CheckpointLeases(redis_server.client(), KEYS)
    assert leases.acquire("s-a", [step_name(1), step_name(3)], ttl=60) == [True, True]
    deleted = store.prune(keep=1, grace_seconds=0, max_on_disk=1, leases=leases)
    assert deleted == [2, 4] and store.versions() == [1, 3, 5]
    assert leases.held() == {step_name(1): ["s-a"], step_name(3): ["s-a"]}
    leases.release("s-a", [step_name(1)])
    assert store.prune(keep=1, grace_seconds=0, max_on_disk=1, leases=leases) == [1]
    assert store.prune(keep=1, grace_seconds=0, max_on_disk=1) == [3]  # no leases asked: retention alone


def test_an_expired_lease_frees_its_checkpoint(redis_server, store) -> None:
    leases = CheckpointLeases(redis_server.client(), KEYS)
    leases.acquire("dead-searcher", [step_name(2)], ttl=0.3)
    assert store.prune(keep=3, grace_seconds=0, leases=leases) == [1]
    time.sleep(0.4)
    assert store.prune(keep=3, grace_seconds=0, leases=leases) == [2]


def test_no_lease_on_a_checkpoint_being_pruned(redis_server, store) -> None:
    leases = CheckpointLeases(redis_server.client(), KEYS)
    assert leases.claim([step_name(2)]) == [step_name(2)]  # the trainer decided: deleting it now
    assert leases.acquire("s-a", [step_name(2), step_name(4)], ttl=60) == [False, True]
    leases.pruned([step_name(2)])  # deleted: a lease from now on finds the directory gone instead
    assert leases.acquire("s-a", [step_name(2)], ttl=60) == [True]


def test_without_redis_nothing_is_pruned(redis_server, store, tmp_path: Path) -> None:
    leases = CheckpointLeases(redis_server.client(), KEYS)
    redis_server.stop(kill=True)
    with pytest.raises(redis.RedisError):
        store.prune(keep=1, grace_seconds=0, leases=leases)
    assert store.versions() == [1, 2, 3, 4, 5]
    # The trainer's own prune says so and goes on training.
    trainer = Trainer(
        TrainerSettings(checkpoint_dir=store.root, keep_checkpoints=1, checkpoint_grace_seconds=0, model=tmp_path)
    )
    trainer._leases = leases
    assert trainer.prune() == [] and store.versions() == [1, 2, 3, 4, 5]


def test_the_trainer_honours_a_searchers_keeper(redis_server, store, tmp_path: Path) -> None:
    keeper = LeaseKeeper(lambda: CheckpointLeases(redis_server.client(), KEYS), "searcher-0", ttl=0.4).start()
    try:
        assert keeper.acquire(step_name(2)) is Lease.HELD
        trainer = Trainer(
            TrainerSettings(checkpoint_dir=store.root, keep_checkpoints=1, checkpoint_grace_seconds=0, model=tmp_path)
        )
        trainer._leases = CheckpointLeases(redis_server.client(), KEYS)
        time.sleep(1.0)  # longer than the lease: the keeper renewed it
        assert trainer.prune() == [1, 3, 4] and store.versions() == [2, 5]
        keeper.release(step_name(2))
        assert trainer.prune() == [2]
        assert keeper.acquire(step_name(5)) is Lease.HELD
    finally:
        keeper.stop()
    assert keeper.held == set() and CheckpointLeases(redis_server.client(), KEYS).held() == {}


def test_leases_work_alike_on_a_redis_cluster(redis_cluster, store) -> None:
    """Both keys share the {ckpt} hash tag: each script runs in one slot of a cluster."""
    leases = CheckpointLeases(redis_cluster.client(), Keys("cluster"))
    assert leases.acquire("s-a", [step_name(2)], ttl=60) == [True]
    assert store.prune(keep=1, grace_seconds=0, leases=leases) == [1, 3, 4]
    assert leases.acquire("s-b", [step_name(2), step_name(5)], ttl=60) == [True, True]
    assert leases.held() == {step_name(2): ["s-a", "s-b"], step_name(5): ["s-b"]}
