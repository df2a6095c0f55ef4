"""tba up's process supervision with real processes: restart on crash, clean stop of the whole group."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from tba.supervisor import Child, Supervisor
from tests.procs import alive


def _wait(pred, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.05)
    return False


def test_a_crashing_child_is_reported_and_restarted(tmp_path: Path) -> None:
    sup = Supervisor(max_restarts=2)
    child = sup.add(Child("crasher", [sys.executable, "-c", "import sys; sys.exit(3)"], dict(os.environ),
                          tmp_path / "crasher.log"))
    assert _wait(lambda: (sup.check(), child.restarts >= 1)[1], timeout=10)
    assert child.exit_codes[0] == 3
    assert any("exited with code 3" in e for e in sup.events)
    sup.stop_all()


def test_stop_kills_grandchildren_too(tmp_path: Path) -> None:
    """A child that spawns a process of its own (as vLLM does) leaves nothing behind."""
    pid_file = tmp_path / "grandchild.pid"
    code = (
        "import subprocess, sys, time, signal\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"  # a stubborn child: ignores SIGTERM
        f"p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\n"
        f"open({str(pid_file)!r}, 'w').write(str(p.pid))\n"
        "time.sleep(600)\n"
    )
    sup = Supervisor()
    child = sup.add(Child("parent", [sys.executable, "-c", code], dict(os.environ), tmp_path / "p.log"))
    assert _wait(pid_file.exists)
    grandchild = int(pid_file.read_text())
    sup.stop(["parent"], timeout=1.0)
    assert not child.running
    assert _wait(lambda: not alive(grandchild), timeout=5)  # gone, or a zombie nobody reaped yet
