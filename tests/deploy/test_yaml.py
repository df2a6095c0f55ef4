"""Every checked-in YAML config parses, and yamllint finds nothing in it."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.deploy.tools import ROOT, checked_in_yaml, load_yaml_all, run, tool

pytestmark = pytest.mark.deploy
CONFIG = ROOT / "tests/deploy/yamllint.yaml"


def test_there_are_configs_to_check() -> None:
    names = {p.name for p in checked_in_yaml()}
    assert {"docker-compose.yml", "docker-compose.cpu.yml", "kustomization.yaml"} <= names


@pytest.mark.parametrize("path", checked_in_yaml(), ids=lambda p: str(p.relative_to(ROOT)))
def test_parses(path: Path) -> None:
    docs = load_yaml_all(path)
    assert docs and all(isinstance(d, dict) for d in docs)


def test_yamllint_clean() -> None:
    proc = run([tool("yamllint"), "-c", str(CONFIG), "-f", "parsable", *map(str, checked_in_yaml())])
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_yamllint_does_fail_on_a_problem(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("a: 1\na: 2\n")
    proc = run([tool("yamllint"), "-c", str(CONFIG), str(bad)])
    assert proc.returncode != 0 and "duplication" in proc.stdout
