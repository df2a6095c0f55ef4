"""Child processes of ``tba up``: start, watch, restart, and stop them cleanly.

Each child runs in its own session (process group), so a Ctrl-C in the terminal
reaches only ``tba up``, which then stops the children in order with SIGTERM
and, after a grace period, SIGKILL of the whole group: nothing is left behind,
not even the engine processes vLLM spawns.

Each child is started under a guard (:mod:`tba.local.lifetime`) that leads its group: the guard ends
what a service leaves in the group when it exits, and stops the group when ``tba up`` itself is
gone, even killed with SIGKILL. A child found dead has whatever is left of its group ended
before it is restarted (the guard's own death leaves the service and its helpers behind), so a
restart never runs next to its predecessor's vLLM engine.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from tba.local.lifetime import end_group, guard_command

log = logging.getLogger("tba.local.up")
# What a guard gives a service between SIGTERM and SIGKILL once tba up is gone (long enough for the trainer's
# last checkpoint and a searcher's in-flight batch on this machine), and a resource tracker left in a dead
# service's group to clean up (lifetime.CLEANERS).
GRACE_SECONDS = 10.0


@dataclass
class Child:
    """One supervised process: its command, environment and log file.

    ``proc`` is the guard that leads the child's process group (its pid is the group id); the
    service itself is the guard's only child."""

    name: str
    argv: list[str]
    env: dict[str, str]
    log_path: Path
    restart: bool = True
    grace: float = GRACE_SECONDS
    cpus: list[int] | None = None  # CPU placement of the child and all it starts (None: anywhere)
    nice: int = 0  # how much nicer the child and all it starts run than this process
    proc: subprocess.Popen | None = None
    restarts: int = 0
    exit_codes: list[int] = field(default_factory=list)
    reaped: list[str] = field(default_factory=list)  # "pid (command)" of what was killed after the last exit
    _next_restart: float = 0.0

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        out = self.log_path.open("ab")
        self.proc = subprocess.Popen(
            guard_command(self.argv, self.name, self.grace, self.cpus, self.nice),
            env=self.env,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        out.close()
        log.info("started %s (process group %d)", self.name, self.proc.pid)

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def poll(self) -> int | None:
        """Exit code if the process ended since the last poll, else None.

        Whatever is still alive in its process group is ended first (``reaped`` lists what had to be
        killed): normally the guard did that already, but a guard killed itself leaves the service and its
        helpers."""
        if self.proc is None or self.proc.poll() is None:
            return None
        code = self.proc.returncode
        self.reaped = end_group(self.proc.pid, self.grace)
        if self.reaped:
            log.warning(
                "%s exited; killed %d processes left in its group: %s",
                self.name,
                len(self.reaped),
                "; ".join(self.reaped),
            )
        self.exit_codes.append(code)
        self.proc = None
        return code

    def signal(self, sig: int) -> None:
        """Signal the child itself (its guard hands the signal on to the service), not its group: a service
        shuts its own helpers (vLLM's engine) down in order; signalling them directly races with that (e.g.
        a reload cut in half)."""
        if self.proc is not None and self.proc.poll() is None:
            try:
                self.proc.send_signal(sig)
            except ProcessLookupError:
                pass

    def stop(self, timeout: float = 15.0, signalled: bool = False) -> None:
        """SIGTERM (unless already sent), wait, then end whatever is left of the process group (``end_group``:
        SIGKILL, a resource tracker given time to clean up first)."""
        if self.proc is None:
            return
        if not signalled:
            self.signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            log.warning("%s did not stop within %.0f s: killing it", self.name, timeout)
        end_group(self.proc.pid, self.grace)  # also grandchildren left in the group
        with contextlib.suppress(ProcessLookupError):  # where /proc cannot list the group: kill it all at once
            os.killpg(self.proc.pid, signal.SIGKILL)
        if self.proc.poll() is None:
            self.proc.wait(5)
        self.proc = None


class Supervisor:
    """Restarts children that die (with backoff) and reports it."""

    def __init__(self, max_restarts: int = 5) -> None:
        self.children: list[Child] = []
        self.max_restarts = max_restarts
        self.events: list[str] = []

    def add(self, child: Child) -> Child:
        self.children.append(child)
        child.start()
        return child

    def check(self) -> None:
        now = time.monotonic()
        for child in self.children:
            code = child.poll()
            if code is not None:
                msg = f"{child.name} exited with code {code} (log: {child.log_path})"
                if child.reaped:
                    msg += f"; killed {len(child.reaped)} processes left in its group"
                self.events.append(msg)
                log.warning(msg)
                child._next_restart = now + min(30.0, 2.0**child.restarts)
            if child.proc is None and child.restart and child.exit_codes and child.exit_codes[-1] != 0:
                if child.restarts >= self.max_restarts:
                    continue
                if now >= child._next_restart:
                    child.restarts += 1
                    self.events.append(f"restarting {child.name} (restart {child.restarts})")
                    child.start()

    def stop(self, names: list[str], timeout: float = 15.0) -> None:
        """Stop the named children together: SIGTERM to all, then wait for each."""
        chosen = [c for c in self.children if c.name in names]
        for child in chosen:
            child.restart = False
            child.signal(signal.SIGTERM)
        for child in chosen:
            child.stop(timeout, signalled=True)

    def stop_all(self, timeout: float = 15.0) -> None:
        self.stop([c.name for c in self.children], timeout)
