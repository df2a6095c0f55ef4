"""Reading processes from /proc, for the reliability suite and the tests that check what a service leaves
running, or how busy it is.

Threads and processes may exit while a caller walks /proc: every reader tolerates that.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from tba.local.lifetime import command_line as cmdline

T = TypeVar("T")

TICKS = os.sysconf("SC_CLK_TCK")


def children(pid: int) -> set[int]:
    """The live children of ``pid`` (those of each of its threads)."""
    out: set[int] = set()
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except FileNotFoundError:
        return out
    for task in tasks:
        try:
            out |= {int(child) for child in (task / "children").read_text().split()}
        except (FileNotFoundError, ProcessLookupError):
            continue  # the thread ended between listing and reading
    return out


def descendants(pid: int) -> set[int]:
    """All live descendants of ``pid``."""
    out: set[int] = set()
    for child in children(pid):
        out |= {child} | descendants(child)
    return out


def guarded_service(up_pid: int, name: str) -> int | None:
    """Pid of the service ``name`` of the ``tba up`` process ``up_pid``: the only child of the guard
    (tba/local/lifetime.py) that runs it, a child of ``tba up``; None while it is not running."""
    for guard in children(up_pid):
        if f"--name {name} " in cmdline(guard):
            services = children(guard)
            return next(iter(services)) if services else None
    return None


def ancestors(pid: int) -> set[int]:
    """``pid`` and every process above it, up to the first process."""
    out = set()
    while pid > 0 and pid not in out:
        out.add(pid)
        try:
            pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except FileNotFoundError:
            break
    return out


def running_with(text: str) -> list[str]:
    """Command lines of live processes whose command line or environment contains ``text``: given a run
    directory, every process of the run (vLLM's engine processes name it in their environment only). This
    process and those above it (which may name the run directory in their own command lines) are not counted."""
    needle = text.encode()
    ours = ancestors(os.getpid())
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) in ours:
            continue
        try:
            if needle in (proc / "cmdline").read_bytes() or needle in (proc / "environ").read_bytes():
                found.append(cmdline(int(proc.name)))
        except OSError:
            continue  # gone meanwhile, or a zombie
    return found


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except FileNotFoundError:
        return False


def cpu_seconds(pid: int) -> float:
    """User + system CPU time ``pid`` has used so far (0 once it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except FileNotFoundError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / TICKS  # utime, stime: fields 14 and 15 of stat


def wait_while_running(
    what: str, probe: Callable[[], T], timeout: float, proc: subprocess.Popen, log: Path, interval: float = 0.2
) -> T:
    """``probe()``'s first truthy value; fails with ``proc``'s log if it exits or time runs out first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = probe()
        if value:
            return value
        if proc.poll() is not None:
            command = " ".join(map(str, proc.args))[:100]
            raise AssertionError(f"{command} exited ({proc.returncode}) before {what}:\n{log.read_text()[-3000:]}")
        time.sleep(interval)
    raise AssertionError(f"no {what} after {timeout:.0f} s:\n{log.read_text()[-3000:]}")
