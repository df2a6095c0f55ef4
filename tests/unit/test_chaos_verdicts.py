"""The chaos suite's verdicts from what it measured (reliability/chaos.py, ``disk_full_verdict``'s examples,
run as ``python -m doctest``): a fault that left no trace in the log fails its criterion with a reason, it
does not end the run; a kept checkpoint that does not verify fails."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_documented_verdicts_hold() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "doctest", "-v", "reliability/chaos.py"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    ran = [line for line in proc.stdout.splitlines() if line.strip().endswith("tests in chaos.disk_full_verdict")]
    assert ran and int(ran[0].split()[0]) >= 8, proc.stdout[-2000:]  # every example ran
