"""The checkpoint protocol between the trainer (writer) and the searchers (readers).

Layout under the checkpoint root (one module builds every path)::

    step-000120/            complete, immutable checkpoint (HF format)
        model.safetensors config.json tokenizer.json generation_config.json ...
        trainer/            the trainer's own resume state (not hashed, not read by searchers)
            manifest.json   the directory's own manifest: its content hash, checked on resume
    LATEST                  JSON manifest of the newest complete checkpoint
    .tmp-...                work in progress: never read
    unusable-step-...       a checkpoint a resume found damaged, set aside for inspection: never read

Publishing: write everything into a ``.tmp-`` directory, rename it to
``step-NNNNNN``, then atomically replace ``LATEST``, then announce the manifest
on Redis (pub/sub plus a key holding the newest). Readers trust only a manifest,
and verify the directory's content hash before loading, so a half-written
checkpoint is never visible.

Durability is per checkpoint. A *durable* commit fsyncs every file before the rename and the
directory after it, so the checkpoint survives the host losing power. The trainer makes durable
only the checkpoints that write the optimizer's state (its resume points, at most
``TBA_OPTIMIZER_STATE_SECONDS`` apart); a weights-only checkpoint between them is renamed straight
from the page cache, which every reader on the host, or behind a network filesystem's
close-to-open consistency, already sees whole. After a power loss such a checkpoint may come
back torn: a resume checks each candidate against its own manifest, sets the damaged ones aside,
and goes on from the newest intact one (at worst the last durable one).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

from tba.codec import PayloadError
from tba.schemas import CheckpointManifest

MANIFEST_NAME = "LATEST"
STEP_PREFIX = "step-"
TMP_PREFIX = ".tmp-"
TRAINER_STATE_DIR = "trainer"
OWN_MANIFEST = "manifest.json"  # in TRAINER_STATE_DIR
UNUSABLE_PREFIX = "unusable-"


class CheckpointError(RuntimeError):
    """A checkpoint that must not be loaded (missing, incomplete, or tampered with)."""


def step_name(version: int) -> str:
    return f"{STEP_PREFIX}{version:06d}"


def content_hash(directory: Path) -> str:
    """sha256 over the names and bytes of the top-level files (the model the searchers load)."""
    h = hashlib.sha256()
    for path in sorted(p for p in directory.iterdir() if p.is_file()):
        h.update(path.name.encode() + b"\0")
        with path.open("rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
        h.update(b"\0")
    return h.hexdigest()


def model_identity(directory: Path) -> str:
    """A model's identity on the wire: the head of its content hash (the same files give the same identity on
    every host, whatever the path)."""
    return content_hash(directory)[:16]


def _fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_tree(directory: Path) -> None:
    for root, _dirs, files in os.walk(directory):
        for name in files:
            _fsync_path(Path(root) / name)
        _fsync_path(Path(root))


class CheckpointStore:
    """Every path under the checkpoint root, and the atomic operations on them."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)

    @property
    def manifest_path(self) -> Path:
        return self.root / MANIFEST_NAME

    def step_dir(self, version: int) -> Path:
        return self.root / step_name(version)

    def resolve(self, manifest: CheckpointManifest) -> Path:
        # The manifest may come from Redis: it names a directory of the root, never a path out of it.
        if manifest.path in (".", "..") or Path(manifest.path).name != manifest.path:
            raise CheckpointError(f"manifest path {manifest.path!r} is not a checkpoint directory name")
        return self.root / manifest.path

    def new_tmp_dir(self) -> Path:
        """A fresh work directory on the same filesystem as the root (so rename is atomic)."""
        self.root.mkdir(parents=True, exist_ok=True)
        tmp = self.root / f"{TMP_PREFIX}{uuid.uuid4().hex}"
        tmp.mkdir()
        return tmp

    def commit(self, tmp_dir: Path, version: int, step: int, durable: bool = True) -> CheckpointManifest:
        """Record ``tmp_dir``'s manifest in it, rename it to ``step-NNNNNN``, then replace LATEST; return the
        manifest. ``durable``: fsync the files before the rename and the directories after it (see the module's
        docstring for which checkpoints skip it)."""
        final = self.step_dir(version)
        if final.exists():
            raise CheckpointError(f"{final} already exists: a version number is never reused")
        manifest = CheckpointManifest(
            version=version, step=step, path=final.name, content_hash=content_hash(tmp_dir), created_at=time.time()
        )
        (tmp_dir / TRAINER_STATE_DIR).mkdir(exist_ok=True)
        (tmp_dir / TRAINER_STATE_DIR / OWN_MANIFEST).write_text(manifest.model_dump_json())
        if durable:
            _fsync_tree(tmp_dir)
        os.rename(tmp_dir, final)
        if durable:
            _fsync_path(self.root)
        self.write_manifest(manifest, durable)
        return manifest

    def write_manifest(self, manifest: CheckpointManifest, durable: bool = True) -> None:
        tmp = self.root / f"{TMP_PREFIX}{MANIFEST_NAME}-{uuid.uuid4().hex}"
        tmp.write_text(manifest.model_dump_json())
        if durable:
            _fsync_path(tmp)
        os.replace(tmp, self.manifest_path)
        if durable:
            _fsync_path(self.root)

    def read_manifest(self) -> CheckpointManifest | None:
        """The newest published manifest, or None if nothing was published yet."""
        try:
            return parse_manifest(self.manifest_path.read_bytes())
        except FileNotFoundError:
            return None

    def verify(self, manifest: CheckpointManifest) -> Path:
        """The checkpoint directory if it is complete and matches its hash; else CheckpointError."""
        directory = self.resolve(manifest)
        if not directory.is_dir():
            raise CheckpointError(f"checkpoint directory {directory} is missing")
        actual = content_hash(directory)
        if actual != manifest.content_hash:
            raise CheckpointError(f"{directory}: content hash {actual[:12]} != manifest {manifest.content_hash[:12]}")
        return directory

    def verify_own(self, version: int) -> CheckpointManifest:
        """Checkpoint ``version``'s own manifest, its content hash checked; CheckpointError if it is damaged.

        A directory without one (written before checkpoints recorded it, durably) is taken as it is."""
        directory = self.step_dir(version)
        try:
            manifest = parse_manifest((directory / TRAINER_STATE_DIR / OWN_MANIFEST).read_bytes())
        except FileNotFoundError:
            return CheckpointManifest(
                version=version, step=version, path=directory.name, content_hash=content_hash(directory)
            )
        except PayloadError as err:
            raise CheckpointError(f"{directory}: {err}") from None
        if manifest.path != directory.name:
            raise CheckpointError(f"{directory}: its manifest names {manifest.path!r}")
        self.verify(manifest)
        return manifest

    def set_aside(self, version: int) -> Path:
        """Rename checkpoint ``version`` out of the protocol (``unusable-step-NNNNNN-<id>``, never read or pruned),
        so that its version number can be published again."""
        aside = self.root / f"{UNUSABLE_PREFIX}{step_name(version)}-{uuid.uuid4().hex[:8]}"
        os.rename(self.step_dir(version), aside)
        return aside

    def versions(self) -> list[int]:
        """Versions of the complete (renamed) checkpoints on disk, oldest first."""
        if not self.root.is_dir():
            return []
        out = []
        for p in self.root.iterdir():
            if p.is_dir() and p.name.startswith(STEP_PREFIX) and p.name[len(STEP_PREFIX) :].isdigit():
                out.append(int(p.name[len(STEP_PREFIX) :]))
        return sorted(out)

    def prune(
        self,
        keep: int,
        grace_seconds: float,
        max_on_disk: int | None = None,
        now: float | None = None,
        leases: PruneGuard | None = None,
    ) -> list[int]:
        """Delete all but the newest ``keep`` checkpoints, sparing any younger than the grace period unless
        ``max_on_disk`` are on disk already, and leftover temporary directories of a crashed writer. Returns the
        deleted versions. The bound matters when checkpoints come faster than the grace period: one every step
        would otherwise leave a minute of them on disk.

        ``leases``: the readers' leases (:mod:`tba.checkpoint_leases`); a checkpoint a reader holds is never
        deleted, whatever its age. What ``leases`` raises (Redis away) is raised, no checkpoint deleted: a reader
        may hold one that cannot be seen. None: no reader is asked (a store without searchers)."""
        now = time.time() if now is None else now
        for p in self.root.glob(f"{TMP_PREFIX}*"):
            if now - p.stat().st_mtime >= grace_seconds:
                shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink(missing_ok=True)
        latest = self.read_manifest()
        versions = self.versions()
        on_disk, bound = len(versions), None if max_on_disk is None else max(max_on_disk, keep)
        doomed = []
        for version in versions[:-keep] if keep else versions:  # oldest first
            path = self.step_dir(version)
            if latest is not None and version == latest.version:
                continue
            young = now - path.stat().st_mtime < grace_seconds
            if young and (bound is None or on_disk <= bound):
                continue
            on_disk -= 1
            doomed.append(version)
        if leases is not None and doomed:
            claimed = set(leases.claim([step_name(v) for v in doomed]))
            doomed = [v for v in doomed if step_name(v) in claimed]
        for version in doomed:
            shutil.rmtree(self.step_dir(version), ignore_errors=True)
        if leases is not None and doomed:
            leases.pruned([step_name(v) for v in doomed])
        return doomed


class PruneGuard(Protocol):
    """What pruning asks of the readers' leases (:class:`tba.checkpoint_leases.CheckpointLeases`)."""

    def claim(self, directories: Sequence[str]) -> list[str]:
        """Those of ``directories`` no reader holds, marked as being deleted."""
        ...

    def pruned(self, directories: Sequence[str]) -> None:
        """They are deleted."""
        ...


def parse_manifest(data: bytes | str) -> CheckpointManifest:
    try:
        return CheckpointManifest.model_validate_json(data)
    except ValueError as err:
        raise PayloadError(f"bad checkpoint manifest: {err}") from None


def announce(redis_client, keys, manifest: CheckpointManifest) -> None:
    """Tell searchers: the key first (late joiners read it), then pub/sub (live ones wake up)."""
    payload = manifest.model_dump_json()
    redis_client.set(keys.latest_manifest, payload)  # two calls, not a MULTI: a cluster serves both
    redis_client.publish(keys.checkpoint_channel, payload)
