"""The settings table of docs/configuration.md, generated from the settings classes (``python -m tba.settings_doc``).

A test compares the file with this output, so it cannot drift from the code.
"""

from __future__ import annotations

import json
import re
import typing
from collections.abc import Callable
from pathlib import Path

from tba.settings import (
    ENV_PREFIX,
    BufferSettings,
    CommonSettings,
    SearcherSettings,
    TrainerSettings,
    setting_sections,
)

START, END = "<!-- settings-table:start -->", "<!-- settings-table:end -->"
SERVICES: dict[str, type[CommonSettings]] = {
    "buffer": BufferSettings,
    "trainer": TrainerSettings,
    "searcher": SearcherSettings,
}


HEADER = ["| variable | used by | default | description |", "|---|---|---|---|"]


def table(names: tuple[str, ...]) -> str:
    """The markdown table of these settings, in this order."""
    rows = list(HEADER)
    for name in names:
        users = [svc for svc, cls in SERVICES.items() if name in cls.model_fields]
        cls = next(c for c in SERVICES.values() if name in c.model_fields)
        field = cls.model_fields[name]
        default = field.get_default(call_default_factory=False)
        container = typing.get_origin(field.annotation) or field.annotation
        if field.default_factory is not None and container in (dict, list):
            shown = f"`{json.dumps(field.get_default(call_default_factory=True, validated_data={}))}`"
        elif field.default_factory is not None:  # derived from the host or process (ids)
            shown = "(per host)"
        else:
            shown = "unset" if default is None else f"`{default}`"
        who = "all" if len(users) == len(SERVICES) else ", ".join(users)
        rows.append(f"| `{ENV_PREFIX}{name.upper()}` | {who} | {shown} | {field.description} |")
    return "\n".join(rows)


def sections() -> list[tuple[str, tuple[str, ...]]]:
    """Every setting once, in the sections of :func:`tba.settings.setting_sections`: what every service shares,
    the buffer's, the model's, the trainer's groups, the searcher's."""
    out: list[tuple[str, tuple[str, ...]]] = []
    seen: set[str] = set()
    for cls in SERVICES.values():
        for title, names in setting_sections(cls):
            fresh = tuple(n for n in names if n not in seen)
            seen.update(fresh)
            if fresh:
                out.append((title, fresh))
    return out


def grouped_tables() -> str:
    """docs/configuration.md's tables: one per section."""
    parts = [f"### {title}\n\n{table(names)}" for title, names in sections()]
    return "\n\n".join(parts)


ROOT = Path(__file__).resolve().parents[1]
# Each generated file and what goes between its markers.
TABLES: dict[Path, Callable[[], str]] = {
    ROOT / "docs" / "configuration.md": grouped_tables,
}


def update(path: Path, render: Callable[[], str]) -> bool:
    """Rewrite the tables between the markers; return True if the file changed."""
    text = path.read_text()
    new = re.sub(f"{re.escape(START)}.*?{re.escape(END)}", lambda _: f"{START}\n{render()}\n{END}", text, flags=re.S)
    if new != text:
        path.write_text(new)
    return new != text


if __name__ == "__main__":
    for path, render in TABLES.items():
        print(f"{path.relative_to(ROOT)}: settings table", "updated" if update(path, render) else "up to date")
