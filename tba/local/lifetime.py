"""Process lifetimes: nothing a process starts outlives it, however it ends.

Two mechanisms, for two kinds of parent:

* :func:`tba.procs.die_with_parent`: a process asks the kernel for a signal when its parent dies
  (``PR_SET_PDEATHSIG``). Used where the parent is a launcher we do not write (torchrun's ranks)
  and by the guard below for the service it starts.
* The *guard* (``python -m tba.local.lifetime``): the supervisor of ``tba up`` starts every service
  through one. The guard leads the service's process group (the supervisor starts it in a new
  session), so the service and whatever it starts (vLLM's engine core and workers, multiprocessing's
  resource tracker, redis-server's rewrite child) are members of the guard's group. The guard:

  - forwards the supervisor's signals to the service, which shuts its own helpers down in order;
  - when the service exits, however it ended, ends whatever is left in the group
    (:func:`end_group`), then exits with the service's status (a service killed by a signal
    makes the guard die of the same signal), so the supervisor sees what it would have seen
    without a guard;
  - when its own parent (the supervisor) is gone, even killed with SIGKILL, it sends the service
    SIGTERM, and SIGKILL to the whole group after a grace period.

  The guard polls rather than waits on signals: parent-death signals fire when the *thread* that
  forked exits, and a multi-threaded supervisor may start a child from any thread; polling its
  parent's pid a few times a second costs nothing measurable.

The helpers below read process groups from ``/proc`` (Linux); elsewhere the guard forwards signals and
stops its service, but cannot see the rest of its group.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import resource
import signal
import subprocess
import sys
import time
from collections.abc import Iterable
from pathlib import Path

from tba.process_tree import children, command_line, stat_fields
from tba.procs import die_with_parent, parse_cpu_list

POLL_SECONDS = 0.1
# Signals the guard hands on to the service (the supervisor's stop, a user's Ctrl-C or reload signals).
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)


def alive_in(pgid: int, pid: int) -> bool:
    """Whether ``pid`` is a live (not zombie) member of group ``pgid``."""
    fields = stat_fields(pid)
    return fields is not None and fields[0] != "Z" and int(fields[2]) == pgid


def group_members(pgid: int) -> list[int]:
    """Live (not zombie) processes of process group ``pgid`` (none where there is no /proc)."""
    if not Path("/proc").is_dir():
        return []
    return sorted(int(e.name) for e in Path("/proc").iterdir() if e.name.isdigit() and alive_in(pgid, int(e.name)))


def describe(pids: Iterable[int]) -> list[str]:
    """``"pid (command)"`` for each of ``pids``, for logs."""
    return [f"{pid} ({command_line(pid)[:120]})" for pid in pids]


# Processes that clean up after the others: multiprocessing's resource tracker reads EOF once every process it
# serves is gone, then unlinks the shared memory and semaphores they left registered (vLLM's message queues,
# up to hundreds of MB each in /dev/shm). Killed along with them, it would leave those behind.
CLEANERS = ("multiprocessing.resource_tracker",)


def end_group(pgid: int, grace: float, spare: int | None = None) -> list[str]:
    """End every live member of group ``pgid`` except ``spare``; return those it killed as ``"pid (command)"``.

    The members are what a service left behind (or a service past its grace period): they get SIGKILL at
    once, except the :data:`CLEANERS`, which get up to ``grace`` seconds to clean up and exit by themselves
    (SIGKILL after that). Returns once the group is empty, or about 2 s after the last SIGKILL."""
    spared = {spare} if spare is not None else set()
    cleaners = {pid for pid in group_members(pgid) if any(name in command_line(pid) for name in CLEANERS)}
    killed = _kill(pgid, spare=cleaners | spared)
    deadline = time.monotonic() + grace
    while any(alive_in(pgid, pid) for pid in cleaners) and time.monotonic() < deadline:
        time.sleep(0.05)
    killed |= _kill(pgid, spare=spared)
    return list(killed.values())


def _kill(pgid: int, spare: set[int], wait: float = 2.0) -> dict[int, str]:
    """SIGKILL every live member of group ``pgid`` not in ``spare``, in rounds (a member may fork between
    listing and killing), until none is left or ``wait`` seconds have passed; returns them by pid. Waiting
    for them to be gone means a restarted service never meets its predecessor's helpers (ports, memory)."""
    killed: dict[int, str] = {}
    deadline = time.monotonic() + wait
    while True:
        members = [pid for pid in group_members(pgid) if pid not in spare]
        if not members or time.monotonic() > deadline:
            return killed
        for pid, text in zip(members, describe(members), strict=True):
            killed.setdefault(pid, text)
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.02)


def guard_command(argv: list[str], name: str, grace: float, cpus: list[int] | None = None, nice: int = 0) -> list[str]:
    """The command that runs ``argv`` under a guard whose parent is this process (on ``cpus`` and at ``nice``
    if given)."""
    where = ["--cpus", ",".join(map(str, cpus))] if cpus else []
    where += ["--nice", str(nice)] if nice else []
    return [
        sys.executable,
        "-m",
        "tba.local.lifetime",
        "--name",
        name,
        "--parent",
        str(os.getpid()),
        "--grace",
        str(grace),
        *where,
        "--",
        *argv,
    ]


def guarded_service(parent: int, name: str) -> int | None:
    """Pid of the service ``name`` that a guard of ``parent`` (:func:`guard_command`) runs: the guard's only
    child; None while it is not running (a supervisor between restarts)."""
    for guard in children(parent):
        if f"--name {name} " in command_line(guard):
            services = children(guard)
            return next(iter(services)) if services else None
    return None


def _say(name: str, message: str) -> None:
    """A line in the service's log (the guard shares the service's stderr), in the services' own format."""
    print(
        f"{time.strftime('%H:%M:%S')} WARNING tba.local.lifetime: guard of {name}: {message}",
        file=sys.stderr,
        flush=True,
    )


def _exit_like(code: int) -> None:
    """Exit as the service did: with its code, or killed by the same signal (without a core dump)."""
    if code >= 0:
        sys.exit(code)
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    if -code != signal.SIGKILL:
        signal.signal(-code, signal.SIG_DFL)
    os.kill(os.getpid(), -code)
    sys.exit(128 - code)  # a signal whose default action is not to terminate


def guard(argv: list[str], name: str, parent: int, grace: float) -> None:
    """Run ``argv`` as described in the module docstring; never returns."""
    me = os.getpid()
    service = subprocess.Popen(argv, preexec_fn=lambda: die_with_parent(signal.SIGTERM))

    def forward(signum: int, _frame: object) -> None:
        try:
            service.send_signal(signum)
        except ProcessLookupError:
            pass

    for sig in FORWARDED:
        signal.signal(sig, forward)
    orphaned_at: float | None = None
    while (code := service.poll()) is None:
        if orphaned_at is None and os.getppid() != parent:
            orphaned_at = time.monotonic()
            _say(
                name, f"parent {parent} is gone: stopping the service (SIGTERM; SIGKILL to its group after {grace:g} s)"
            )
            forward(signal.SIGTERM, None)
        elif orphaned_at is not None and time.monotonic() - orphaned_at > grace:
            _say(name, "grace period over: killing the group")
            end_group(me, grace, spare=me)
        time.sleep(POLL_SECONDS)
    killed = end_group(me, grace, spare=me)
    if killed:
        how = f"code {code}" if code >= 0 else signal.Signals(-code).name
        _say(name, f"service exited ({how}); killed {len(killed)} processes left in its group: {'; '.join(killed)}")
    _exit_like(code)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m tba.local.lifetime",
        description="Run a service as the guard of its process group: forward signals to it, kill what it leaves "
        "behind, stop it when the parent is gone.",
    )
    parser.add_argument("--name", required=True, help="The service's name, for log lines.")
    parser.add_argument("--parent", type=int, required=True, help="Pid of the supervisor: its death stops all.")
    parser.add_argument(
        "--grace",
        type=float,
        default=10.0,
        help="Seconds the service gets between SIGTERM and SIGKILL once the parent is gone, and "
        "a resource tracker left in the group to clean up.",
    )
    parser.add_argument(
        "--cpus", default=None, help="Run the service and everything it starts on these CPUs (e.g. 0 or 1-3)."
    )
    parser.add_argument(
        "--nice", type=int, default=0, help="Run the service and everything it starts this much nicer (0-19)."
    )
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- then the service's command.")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command to run")
    if args.cpus:  # inherited by the service and its children (vLLM's engine core and workers)
        try:
            os.sched_setaffinity(0, parse_cpu_list(args.cpus, "--cpus"))
        except (ValueError, OSError) as err:
            parser.error(f"--cpus {args.cpus!r}: {err}")
    if not 0 <= args.nice <= 19:
        parser.error(f"--nice must be in [0, 19], got {args.nice}")
    if args.nice:
        os.nice(args.nice)  # inherited, as the CPUs are
        # The guard leads a session of its own, which Linux schedules as one group (autogroup) against the
        # others: nice counts only inside a group, so the group itself is made as nice.
        with contextlib.suppress(OSError):
            Path("/proc/self/autogroup").write_text(str(args.nice))
    guard(command, args.name, args.parent, args.grace)


if __name__ == "__main__":
    main()
