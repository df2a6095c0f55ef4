"""The run's held-out evaluations: each checkpoint's greedy accuracy, on as many cores as the run has, in order.

``tba up`` evaluates every new checkpoint while it runs (on the searchers' cores) and, with ``--eval-after``,
the checkpoints it set aside (hard links, so the trainer's pruning cannot take them) once the run is over,
one process per core.
"""

from __future__ import annotations

import functools
import multiprocessing
import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tba.procs import die_with_parent


@dataclass(frozen=True)
class TakenCheckpoint:
    """A checkpoint set aside during the run to be evaluated after it (``--eval-after``)."""

    t: float  # seconds into the run when it was taken: the time its evaluation is recorded at
    version: int
    path: Path
    content_hash: str | None  # what its files must hash to (None: the base model, not a published checkpoint)


def link_checkpoint(src: Path, dest: Path) -> Path:
    """``dest`` holding the model files of the checkpoint ``src`` (its top-level files, not the trainer's resume
    state), hard-linked where the file system allows, else copied. A published checkpoint's files are never
    written again, so a link is a snapshot that outlives the trainer's pruning of ``src``, and costs no copy.
    Built beside ``dest`` and renamed into place: a ``dest`` that exists is whole."""
    tmp = dest.with_name(f".{dest.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        for path in src.iterdir():
            if path.is_file():
                try:
                    os.link(path, tmp / path.name)
                except FileNotFoundError:
                    raise
                except OSError:  # another file system, or one without hard links
                    shutil.copy2(path, tmp / path.name)
        os.replace(tmp, dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return dest


def greedy_accuracy(model_dir: Path, options: dict[str, Any], threads: int = 0) -> float:
    """Held-out greedy accuracy of ``model_dir`` (``options``: :meth:`LocalRun._eval_options`), on ``threads``
    torch threads (0: the idle cores)."""
    from tba.model.evaluation import evaluate_checkpoint

    return float(evaluate_checkpoint(model_dir, threads=threads, **options)["greedy_accuracy"])


def _start_eval_worker(cpus: list[int]) -> None:
    """An evaluation process of :func:`evaluate_on_cores`: it dies with ``tba up``, and may run on any of the
    run's cores (``tba up`` itself keeps to the searchers' cores once the services are up)."""
    die_with_parent()
    os.sched_setaffinity(0, cpus)


def evaluate_on_cores(model_dirs: list[Path], options: dict[str, Any], cpus: list[int]) -> Iterator[float]:
    """The greedy accuracy of each of ``model_dirs``, in order, as each is known: one single-threaded evaluation
    per core of ``cpus`` at a time (a tiny model's evaluation is too small to spread over threads, so processes
    get the cores' worth), or in this process where there is one core or one model. One thread each, always:
    the same arithmetic for every checkpoint of a run."""
    workers = min(len(cpus), len(model_dirs))
    if workers <= 1:
        for model_dir in model_dirs:
            yield greedy_accuracy(model_dir, options, threads=1)
        return
    # Spawned, not forked: this process has threads (the console, the listeners) and torch's state.
    spawn = multiprocessing.get_context("spawn")
    with spawn.Pool(workers, initializer=_start_eval_worker, initargs=(cpus,)) as pool:  # leaving it kills them
        yield from pool.imap(functools.partial(greedy_accuracy, options=options, threads=1), model_dirs)
