"""Where a secret turns up: the search that shows no token or password reaches what a run writes or answers.

The reliability suite's security checks and the end-to-end tests search a run's answers, logs, checkpoints
and Redis files for the secrets the run was given; a secret found is named with where it was.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path


def leaks(secrets: dict[str, str], texts: Iterable[str], files: Iterable[Path]) -> list[str]:
    """Where any of ``secrets`` (name -> value) occurs: ``"<name> in answer <i>: <text>"`` for each of
    ``texts``, ``"<name> in <file>"`` for each of ``files`` (read as bytes: binary files count too)."""
    found = []
    for i, text in enumerate(texts):
        for name, value in secrets.items():
            if value in text:
                found.append(f"{name} in answer {i}: {text[:80]!r}")
    for path in files:
        data = path.read_bytes() if path.is_file() else b""
        for name, value in secrets.items():
            if value.encode() in data:
                found.append(f"{name} in {path}")
    return found


def files_under(root: Path) -> list[Path]:
    """Every file below ``root``: for a run directory, the services' logs, the checkpoints with the trainer's
    state, the summary, timeline, report, TensorBoard and W&B files, Redis's own files."""
    return sorted(path for path in root.rglob("*") if path.is_file())
