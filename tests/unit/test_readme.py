"""The README tells the truth about configuration and commands."""

from __future__ import annotations

from pathlib import Path

from tba.settings_doc import END, START, table

ROOT = Path(__file__).resolve().parents[2]


def test_settings_table_matches_the_code() -> None:
    readme = (ROOT / "README.md").read_text()
    block = readme.split(START, 1)[1].split(END, 1)[0].strip()
    assert block == table(), "README settings table is stale: run `python -m tba.settings_doc`"


def test_readme_commands_exist_in_makefile() -> None:
    makefile = (ROOT / "Makefile").read_text()
    for target in ("demo:", "test:", "bench:", "experiment:"):
        assert f"\n{target}" in makefile, target
    assert "make test" in (ROOT / ".ci" / "run").read_text()
