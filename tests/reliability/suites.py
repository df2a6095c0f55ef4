"""Running a reliability suite as its make target does (``python -m reliability.<name>``), and reading what it
found from its ``--result`` file: the tests drive the suites as programs and import nothing of them.

The suite runs under the project's lifetime guard (tba/local/lifetime.py): killed with pytest, even by
SIGKILL, it stops and leaves nothing running. It writes no RELIABILITY.md section (``--no-report``).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from tba.local.lifetime import guard_command

ROOT = Path(__file__).resolve().parents[2]
GRACE_SECONDS = 30.0  # a suite stopping its buffer (and, in chaos, `tba up` its services) on SIGTERM


def run_suite(name: str, *args: object, workdir: Path, timeout: float) -> dict[str, Any]:
    """``python -m reliability.<name> ARGS`` to its end (at most ``timeout`` seconds); the findings it wrote.

    Its exit status must agree with its verdict (0 when it passed, 1 when it did not), as ``make <name>``
    relies on; its output is in ``workdir/<name>.log``, whose end every failure shows."""
    workdir.mkdir(parents=True, exist_ok=True)
    result, log = workdir / f"{name}-result.json", workdir / f"{name}.log"
    argv = [sys.executable, "-m", f"reliability.{name}", *map(str, args), "--no-report", "--result", str(result)]
    with log.open("w") as out:
        proc = subprocess.Popen(
            guard_command(argv, f"reliability-{name}", grace=GRACE_SECONDS),
            cwd=ROOT,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # the guard leads the suite's group
        )
        try:
            code = proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            raise AssertionError(f"{name} ran past {timeout:.0f} s:\n{tail(log)}") from None
    assert result.exists(), f"{name} exited with {code} and wrote no result:\n{tail(log)}"
    found = json.loads(result.read_text())
    assert code == (0 if found["passed"] else 1), f"{name} exited with {code}, verdict {found['passed']}:\n{tail(log)}"
    return found


def tail(log: Path, chars: int = 4000) -> str:
    return log.read_text(errors="replace")[-chars:]
