"""scripts/bootstrap.sh on a machine whose pip cannot find PyTorch's CPU wheel: it stops at once and says
which wheel is missing and which index serves it, instead of failing somewhere in a 150-package install."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_a_missing_cpu_torch_wheel_is_named_with_its_index(tmp_path: Path) -> None:
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("PIP_")},  # no find-links, no extra index
        "VENV": str(tmp_path / "venv"),
        "PIP_CONFIG_FILE": os.devnull,  # no pip.conf: no local wheel folder, no extra index
        "PIP_NO_INDEX": "1",
    }
    proc = subprocess.run(
        ["bash", "scripts/bootstrap.sh"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode != 0
    lock = (ROOT / "requirements/cpu.txt").read_text().splitlines()
    torch_pin = next(line for line in lock if line.startswith("torch=="))
    assert f"pip found no wheel for {torch_pin}" in proc.stderr
    assert "PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu make install" in proc.stderr
    assert not list((tmp_path / "venv").glob(".stamp-*")), "a failed bootstrap must not mark the venv as done"
