"""Waiting in a test for a process it started: to get somewhere (failing with its log if it exits first), or to end."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from tba.process_tree import alive

T = TypeVar("T")


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


def gone_within(pid: int, timeout: float) -> bool:
    """Whether process ``pid`` has ended (or is a zombie) within ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while alive(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True
