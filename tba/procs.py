"""Process helpers the services need as well as the launcher: dying with the parent, CPU lists, pinning.

The guard that keeps every process of a local run from outliving it is tba/local/lifetime.py; these are
the two pieces of it a service uses on its own (torchrun's ranks die with their launcher; a searcher
reads the cores it may use).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys

PR_SET_PDEATHSIG = 1
# Looked up once, here: in a forked child (``preexec_fn``) loading a library could wait forever on a lock
# another thread of the parent held at the fork.
_PRCTL = ctypes.CDLL(None, use_errno=True).prctl if sys.platform.startswith("linux") else None


def die_with_parent(sig: int = signal.SIGKILL) -> None:
    """Have the kernel send ``sig`` to this process when its parent dies.

    The signal fires when the thread that forked this process exits, so the parent should start it
    from a thread that lives as long as the parent (its main thread). A parent that died before this
    call is caught by comparing parent pids: the process exits at once. Linux only; elsewhere nothing
    changes. Meant for ``preexec_fn``."""
    if _PRCTL is None:
        return
    parent = os.getppid()
    _PRCTL(PR_SET_PDEATHSIG, int(sig))
    if os.getppid() != parent:  # the parent died before the line above
        os._exit(1)


def parse_cpu_list(text: str, what: str = "cpu list") -> list[int]:
    """``"0-2,5|6"`` (vLLM's form: ``|`` between tensor-parallel ranks) -> [0, 1, 2, 5, 6]."""
    cpus: set[int] = set()
    for part in text.replace("|", ",").split(","):
        part = part.strip()
        if not part:
            continue
        lo, _, hi = part.partition("-")
        try:
            first, last = int(lo), int(hi or lo)
            if first < 0 or last < first:
                raise ValueError
        except ValueError:
            raise ValueError(f"{what}={text!r}: {part!r} is not a CPU id or range") from None
        cpus.update(range(first, last + 1))
    return sorted(cpus)


def threads(pid: int) -> list[int]:
    """The thread ids of ``pid`` (none once it has exited, or on a host without /proc)."""
    try:
        return [int(t) for t in os.listdir(f"/proc/{pid}/task")]
    except FileNotFoundError:
        return []


def pin_threads(pid: int, cpus: set[int]) -> None:
    """Pin every thread ``pid`` has now to ``cpus``; threads it starts later inherit their starter's CPUs.

    ``sched_setaffinity(0, ...)`` moves only the calling thread, so a process that already runs helper
    threads (a logging queue, a library's pool) must move each of them too."""
    for tid in threads(pid):
        with contextlib.suppress(ProcessLookupError):  # a thread that ended since the listing
            os.sched_setaffinity(tid, cpus)
