"""``tba up --eval-after`` sets checkpoints aside as hard links: a snapshot that costs no copy, outlives the
trainer's pruning, and exists only whole."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from tba.local.eval_pool import link_checkpoint


def checkpoint(root: Path) -> Path:
    src = root / "step-000004"
    (src / "trainer").mkdir(parents=True)
    (src / "model.safetensors").write_bytes(b"weights" * 100)
    (src / "config.json").write_text("{}")
    (src / "trainer" / "optimizer.pt").write_bytes(b"state")
    return src


def test_the_model_files_are_linked_and_outlive_the_checkpoint(tmp_path: Path) -> None:
    src = checkpoint(tmp_path / "ckpts")
    inode = (src / "model.safetensors").stat().st_ino
    dest = link_checkpoint(src, tmp_path / "evaluated" / "v000004")
    assert sorted(p.name for p in dest.iterdir()) == ["config.json", "model.safetensors"]  # no resume state
    assert (dest / "model.safetensors").stat().st_ino == inode  # a link, not a copy
    for path in sorted(src.rglob("*"), reverse=True):  # the trainer prunes the checkpoint
        path.rmdir() if path.is_dir() else path.unlink()
    src.rmdir()
    assert (dest / "model.safetensors").read_bytes() == b"weights" * 100


def test_a_file_system_without_links_gets_a_copy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    src = checkpoint(tmp_path / "ckpts")

    def cross_device(a, b) -> None:
        raise OSError(errno.EXDEV, "Invalid cross-device link")

    monkeypatch.setattr(os, "link", cross_device)
    dest = link_checkpoint(src, tmp_path / "evaluated" / "v000004")
    assert (dest / "model.safetensors").read_bytes() == b"weights" * 100
    assert (dest / "model.safetensors").stat().st_ino != (src / "model.safetensors").stat().st_ino


def test_a_checkpoint_pruned_while_linked_leaves_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    src = checkpoint(tmp_path / "ckpts")
    real_link = os.link
    calls = []

    def pruned_midway(a, b) -> None:
        calls.append(a)
        if len(calls) == 2:
            raise FileNotFoundError(errno.ENOENT, "No such file or directory", a)
        real_link(a, b)

    monkeypatch.setattr(os, "link", pruned_midway)
    with pytest.raises(FileNotFoundError):
        link_checkpoint(src, tmp_path / "evaluated" / "v000004")
    assert list((tmp_path / "evaluated").iterdir()) == []  # neither the snapshot nor its half-built directory


def run_with_taken(tmp_path: Path, parent: int):
    """A ``LocalRun`` as its shutdown finds it with --eval-after: one checkpoint set aside, none published since."""
    from types import SimpleNamespace

    from tba.local.eval_pool import TakenCheckpoint
    from tba.local.up import LocalRun

    run = object.__new__(LocalRun)  # no services: only the shutdown's last step is under test
    run.args = SimpleNamespace(eval_after=True, keep_evaluated=False)
    run.ckpt_dir, run.run_dir, run.parent = tmp_path / "checkpoints", tmp_path, parent
    run.taken = [TakenCheckpoint(0.0, 0, tmp_path / "evaluated" / "v000000", None)]
    evaluated = []
    run._evaluate_taken = lambda observer: evaluated.append(observer)
    return run, evaluated


def test_the_evaluations_after_the_run_wait_for_nobody_once_the_parent_is_gone(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    run, evaluated = run_with_taken(tmp_path, parent=os.getppid())
    run._final_eval("observer", stopped_at=60.0)
    assert evaluated == ["observer"]  # the parent still waits: the checkpoints are evaluated

    orphan, evaluated = run_with_taken(tmp_path, parent=os.getppid() + 1)  # started by a process now gone
    orphan._final_eval("observer", stopped_at=60.0)
    assert evaluated == []
    assert "parent process is gone" in caplog.text and "tba eval" in caplog.text
