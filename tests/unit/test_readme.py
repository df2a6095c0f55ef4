"""The README tells the truth about configuration and commands."""

from __future__ import annotations

from pathlib import Path

from tba.settings_doc import END, FIRST, START, TABLES, table

ROOT = Path(__file__).resolve().parents[2]


def test_settings_tables_match_the_code() -> None:
    """docs/configuration.md lists every setting, the README the ten people change first, each row as the code
    has it."""
    for path, only in TABLES.items():
        block = path.read_text().split(START, 1)[1].split(END, 1)[0].strip()
        assert block == table(only), f"{path.name}: settings table is stale: run `python -m tba.settings_doc`"
    assert len(FIRST) == 10 and set(table(FIRST).splitlines()[2:]) <= set(table().splitlines())


def test_readme_commands_exist_in_makefile() -> None:
    makefile = (ROOT / "Makefile").read_text()
    for target in ("demo:", "test:", "bench:", "experiment:"):
        assert f"\n{target}" in makefile, target
    assert "make test" in (ROOT / ".ci" / "run").read_text()
