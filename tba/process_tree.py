"""Processes as Linux shows them in /proc: their command lines, whether they live, their children and
ancestors, the CPU time and memory they use, and every process that names a given run.

The launcher's guard reads command lines here; the tests and the reliability suites check with the rest
what a service leaves running, and how busy it is. Processes and threads may exit while a caller walks
/proc: every reader tolerates that (a process that is gone has no children, no command line, uses nothing).
"""

from __future__ import annotations

import os
from pathlib import Path

TICKS = os.sysconf("SC_CLK_TCK")


def stat_fields(pid: int) -> list[str] | None:
    """Fields of ``/proc/<pid>/stat`` after the command name (state first), or None if it is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return None


def command_line(pid: int) -> str:
    """``pid``'s command line as one string ("" once it is gone)."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except (FileNotFoundError, ProcessLookupError):
        return ""


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, which has ended and waits to be reaped, does not)."""
    fields = stat_fields(pid)
    return fields is not None and fields[0] != "Z"


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


def ancestors(pid: int) -> set[int]:
    """``pid`` and every process above it, up to the first process."""
    out = set()
    while pid > 0 and pid not in out:
        out.add(pid)
        fields = stat_fields(pid)
        if fields is None:
            break
        pid = int(fields[1])  # the parent's pid
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
                found.append(command_line(int(proc.name)))
        except OSError:
            continue  # gone meanwhile, or a zombie
    return found


def cpu_seconds(pid: int) -> float:
    """User + system CPU time ``pid`` has used so far (0 once it is gone)."""
    fields = stat_fields(pid)
    if fields is None:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / TICKS  # utime, stime: fields 14 and 15 of stat


def rss_bytes(pid: int) -> int:
    """Resident set size of ``pid`` (``VmRSS`` of /proc/<pid>/status), in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"/proc/{pid}/status has no VmRSS (a zombie?)")
