"""The README tells the truth about configuration and commands."""

from __future__ import annotations

from pathlib import Path

from tba.settings_doc import END, FIRST, SERVICES, START, TABLES, sections, table

ROOT = Path(__file__).resolve().parents[2]


def test_settings_tables_match_the_code() -> None:
    """docs/configuration.md lists every setting, the README the ten people change first, each row as the code
    has it."""
    for path, render in TABLES.items():
        block = path.read_text().split(START, 1)[1].split(END, 1)[0].strip()
        assert block == render(), f"{path.name}: settings table is stale: run `python -m tba.settings_doc`"
    listed = [n for _, names in sections() for n in names]
    assert len(FIRST) == 10 and set(table(FIRST).splitlines()) <= set(table(tuple(listed)).splitlines())
    assert sorted(listed) == sorted({n for cls in SERVICES.values() for n in cls.model_fields}), "a setting is missing"


def test_readme_commands_exist_in_makefile() -> None:
    makefile = (ROOT / "Makefile").read_text()
    for target in ("demo:", "test:", "bench:", "experiment:"):
        assert f"\n{target}" in makefile, target
    assert "make test" in (ROOT / ".ci" / "run").read_text()
