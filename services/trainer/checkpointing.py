"""The trainer's side of the checkpoint protocol (:mod:`tba.checkpoints`): publish, announce, prune, resume.

A checkpoint is a Hugging Face model directory (safetensors, config, tokenizer,
generation config) that searchers load as is, or in a LoRA run peft's adapter
directory (adapter config and weights, :mod:`tba.model.adapters`), plus the trainer's own resume
state under ``trainer/`` (optimizer, scheduler, step, beta, RNG states). Both
are written into one temporary directory that :meth:`CheckpointStore.commit`
fsyncs and renames: the rename is the commit point, so every ``step-NNNNNN``
directory is complete and a ``kill -9`` at any moment leaves at most an
unreferenced ``.tmp-`` directory (pruned after the grace period).

The optimizer's state, twice the weights in size, is not written every time
(weights-only publishing, ``TBA_OPTIMIZER_STATE_SECONDS``): a checkpoint may
hard-link the file of the one before it, so every checkpoint stays resumable,
its weights exact and its optimizer moments a few seconds older
(``TrainerState.optimizer_step`` says from which step).

The weights on disk are always fp32 master weights (bf16 runs only autocast the
forward), so resuming loses nothing and searchers cast to their own dtype.
"""

from __future__ import annotations

import json
import logging
import os
import random
import shutil
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, NamedTuple

import torch
from safetensors import SafetensorError

from services.trainer.distributed import ONE_PROCESS, Ranks, full_state, load_optimizer_state
from tba.checkpoints import TRAINER_STATE_DIR, CheckpointError, CheckpointStore, announce
from tba.model.adapters import is_adapter
from tba.schemas import CheckpointManifest

log = logging.getLogger(__name__)

STATE_FILE = "state.json"
OPTIMIZER_FILE = "optimizer.pt"


class CheckpointWriteError(OSError):
    """A checkpoint could not be written (disk full, I/O error): an OSError whatever the serializer raised."""


@dataclass
class TrainerState:
    """Everything besides the weights that a resumed trainer needs to carry on as if never stopped."""

    step: int  # optimizer steps taken; also the policy version of the weights
    beta: float  # beta of the last step taken
    samples_seen: int = 0
    tokens_seen: int = 0
    arrival_cursor: int = 0  # the buffer's arrivals served so far (recency_order "arrival")
    run_seconds: float = 0.0  # the run's time so far (the time-based LR schedule and budget)
    optimizer_step: int | None = None  # the step the optimizer file was written at (None: this one's)
    settings: dict[str, Any] = field(default_factory=dict)  # for humans: what the run was started with


class OptimizerFile(NamedTuple):
    """A checkpoint's optimizer file, and the step and time (``time.monotonic()``) it was written at."""

    path: Path
    step: int
    written_at: float


def optimizer_path(checkpoint: Path) -> Path:
    return checkpoint / TRAINER_STATE_DIR / OPTIMIZER_FILE


def save_checkpoint(
    store: CheckpointStore,
    model,
    tokenizer,
    optimizer,
    scheduler,
    state: TrainerState,
    *,
    model_state: dict | None = None,
    optimizer_state: dict | None = None,
    optimizer_file: Path | None = None,
) -> CheckpointManifest:
    """Write model, tokenizer and trainer state into a temporary directory and commit it as ``state.step``.

    ``model_state`` and ``optimizer_state``: the whole states gathered from the ranks of a sharded trainer
    (:func:`services.trainer.distributed.full_state`); one process passes neither. ``optimizer_file``: the
    optimizer file of an earlier checkpoint (written at ``state.optimizer_step``), hard-linked instead of
    writing the optimizer's state again."""
    if optimizer_file is None and optimizer_state is None:
        model_state, optimizer_state = full_state(model, optimizer, ONE_PROCESS)
    tmp = store.new_tmp_dir()
    try:
        try:
            model.save_pretrained(tmp, state_dict=model_state, safe_serialization=True)
            if not is_adapter(tmp):  # an adapter is served on the base, with the base's tokenizer
                tokenizer.save_pretrained(tmp)
                if getattr(model, "generation_config", None) is not None:
                    model.generation_config.save_pretrained(tmp)
            _save_trainer_state(tmp / TRAINER_STATE_DIR, optimizer_state, scheduler, state, optimizer_file)
        except (RuntimeError, SafetensorError) as err:  # how torch.save and safetensors report a failed write
            raise CheckpointWriteError(f"could not write {tmp}: {err}") from err
        # Durable only where the optimizer's state is written: the resume points (tba/checkpoints.py).
        return store.commit(tmp, version=state.step, step=state.step, durable=optimizer_file is None)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _save_trainer_state(
    directory: Path, optimizer_state: dict | None, scheduler, state: TrainerState, optimizer_file: Path | None = None
) -> None:
    """The optimizer state keyed by parameter name (a run resumes on any number of ranks), schedule, RNGs; or a
    hard link to an earlier checkpoint's file of them."""
    directory.mkdir()
    if optimizer_file is not None:
        os.link(optimizer_file, directory / OPTIMIZER_FILE)
    else:
        assert optimizer_state is not None, "an optimizer state to write or a file to link"
        state = replace(state, optimizer_step=None)
        sched = scheduler.state_dict()
        sched["lr_lambdas"] = [None] * len(sched.get("lr_lambdas", []))  # the schedule comes from the settings
        tensors = {"optimizer": optimizer_state, "scheduler": sched, "torch_rng": torch.get_rng_state()}
        if torch.cuda.is_available():
            tensors["cuda_rng"] = torch.cuda.get_rng_state_all()
        torch.save(tensors, directory / OPTIMIZER_FILE)
    payload = asdict(state) | {"python_rng": _jsonable(random.getstate())}
    (directory / STATE_FILE).write_text(json.dumps(payload, default=str))


def _jsonable(obj):
    return [_jsonable(x) for x in obj] if isinstance(obj, tuple | list) else obj


def _tupled(obj):
    return tuple(_tupled(x) for x in obj) if isinstance(obj, list) else obj


@dataclass
class ResumePoint:
    directory: Path
    manifest: CheckpointManifest
    state: TrainerState


def find_resume_point(store: CheckpointStore) -> ResumePoint | None:
    """The newest intact checkpoint that carries trainer state, re-published (durably) as LATEST.

    A kill between the rename and the manifest write leaves the newest directory complete but unannounced; it is
    still the newest state, so resume from it. A power loss may leave the newest ones torn (weights-only
    checkpoints are not fsynced, :mod:`tba.checkpoints`): each candidate is checked against its own manifest, and
    every damaged one newer than the resume point is set aside, so that its version number can be published again.
    """
    for version in reversed(store.versions()):
        directory = store.step_dir(version)
        try:
            state = load_state(directory)
            manifest = store.verify_own(version)
        except (CheckpointError, OSError, ValueError, KeyError) as err:
            aside = store.set_aside(version)
            log.warning("checkpoint %s is not resumable (%s); set aside as %s", directory.name, err, aside.name)
            continue
        store.write_manifest(manifest)
        return ResumePoint(directory, manifest, state)
    return None


def load_state(directory: Path) -> TrainerState:
    payload = json.loads((directory / TRAINER_STATE_DIR / STATE_FILE).read_text())
    if not optimizer_path(directory).is_file():
        raise CheckpointError(f"{directory} has no optimizer state")
    payload.pop("python_rng", None)
    return TrainerState(**payload)


def restore_trainer_state(directory: Path, model, optimizer, scheduler, ranks: Ranks = ONE_PROCESS) -> None:
    """Load optimizer, scheduler and RNG states saved by :func:`save_checkpoint` into live objects.

    Under torchrun rank 0 reads the file and every rank takes its shard of the optimizer state; schedule
    and RNG states are the same on every rank."""
    tensors = None
    if ranks.main:
        tensors = torch.load(optimizer_path(directory), map_location="cpu", weights_only=True)
    load_optimizer_state(model, optimizer, tensors["optimizer"] if tensors else None, ranks)
    shared = ranks.broadcast({k: v for k, v in tensors.items() if k != "optimizer"} if tensors else None)
    scheduler.load_state_dict(shared["scheduler"])
    torch.set_rng_state(shared["torch_rng"])
    if "cuda_rng" in shared and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(shared["cuda_rng"])
    payload = json.loads((directory / TRAINER_STATE_DIR / STATE_FILE).read_text())
    if payload.get("python_rng"):
        random.setstate(_tupled(payload["python_rng"]))


class Announcer:
    """Announces manifests on Redis; a failed announce is retried later instead of stopping training."""

    def __init__(self, redis_client, keys) -> None:
        self.redis = redis_client
        self.keys = keys
        self.pending: CheckpointManifest | None = None

    def announce(self, manifest: CheckpointManifest) -> bool:
        self.pending = manifest
        return self.flush()

    def flush(self) -> bool:
        """Try the pending announcement once; True when nothing is left pending."""
        if self.pending is None:
            return True
        try:
            announce(self.redis, self.keys, self.pending)
        except Exception as err:  # redis-py raises several families (ConnectionError, TimeoutError, OSError)
            log.warning("could not announce checkpoint v%d on Redis (%s); will retry", self.pending.version, err)
            return False
        log.info("announced checkpoint v%d (%s)", self.pending.version, self.pending.path)
        self.pending = None
        return True
