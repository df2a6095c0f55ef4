"""The code base stays clean: ruff's lint and format, mypy (all configured in pyproject.toml), and the
pre-commit hooks that run them on a commit."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PY_DIRS = ["tba", "services", "tests", "benchmarks", "experiments", "reliability", "scripts"]
BIN = Path(sys.executable).parent


def _run(*args: str, cwd: Path = ROOT, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(args), cwd=cwd, capture_output=True, text=True, env=env)


def test_ruff_is_clean() -> None:
    proc = _run(sys.executable, "-m", "ruff", "check", *PY_DIRS)
    assert proc.returncode == 0, proc.stdout[-4000:]


def test_ruff_format_is_applied() -> None:
    proc = _run(sys.executable, "-m", "ruff", "format", "--check", *PY_DIRS)
    assert proc.returncode == 0, f"run `ruff format {' '.join(PY_DIRS)}`:\n{proc.stdout[-4000:]}"


def test_mypy_is_clean() -> None:
    proc = _run(sys.executable, "-m", "mypy")
    assert proc.returncode == 0, proc.stdout[-4000:]


def test_the_makefile_lints_the_directories_the_tests_check() -> None:
    line = next(x for x in (ROOT / "Makefile").read_text().splitlines() if x.startswith("PY_DIRS :="))
    assert line.split(":=")[1].split() == PY_DIRS


def test_pre_commit_hooks_run_on_a_copy_of_the_tree(tmp_path: Path) -> None:
    """pre-commit itself reads the config and runs every hook over every file, in a fresh repository holding
    the working tree's files (so the hooks' fixes never touch this checkout): all pass, nothing changes."""
    files = _run("git", "ls-files", "--cached", "--others", "--exclude-standard").stdout.split()
    copy = tmp_path / "tree"
    for name in files:
        if (ROOT / name).is_file():
            (copy / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, copy / name)
    (copy / ".venv").symlink_to(BIN.parent)
    if (ROOT / ".mypy_cache").is_dir():  # test_mypy_is_clean's, for these very files: the hook checks them again
        shutil.copytree(ROOT / ".mypy_cache", copy / ".mypy_cache")
    env = {**os.environ, "PRE_COMMIT_HOME": str(tmp_path / "cache"), "GIT_CONFIG_GLOBAL": os.devnull}
    for step in (["git", "init", "-q"], ["git", "add", "-A"]):
        assert _run(*step, cwd=copy, env=env).returncode == 0
    assert _run(str(BIN / "pre-commit"), "validate-config", cwd=copy, env=env).returncode == 0
    proc = _run(str(BIN / "pre-commit"), "run", "--all-files", cwd=copy, env=env)
    assert proc.returncode == 0, proc.stdout[-4000:]
    for hook in ("ruff format", "ruff check", "mypy"):
        assert any(line.startswith(hook) and line.endswith("Passed") for line in proc.stdout.splitlines()), (
            f"hook {hook!r} did not pass:\n{proc.stdout}"
        )
