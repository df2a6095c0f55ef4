"""The settings table of docs/configuration.md, generated from the settings classes (``python -m tba.settings_doc``).

A test compares the file with this output, and the README's short table with the same rows, so neither
can drift from the code.
"""

from __future__ import annotations

import json
import re
import typing
from pathlib import Path

from tba.settings import DEPRECATED, ENV_PREFIX, BufferSettings, CommonSettings, SearcherSettings, TrainerSettings

START, END = "<!-- settings-table:start -->", "<!-- settings-table:end -->"
SERVICES: dict[str, type[CommonSettings]] = {
    "buffer": BufferSettings,
    "trainer": TrainerSettings,
    "searcher": SearcherSettings,
}


# The README's short table: the settings people change first.
FIRST = (
    "task",
    "task_options",
    "model",
    "lr",
    "prompts_per_step",
    "completions_per_prompt",
    "max_staleness",
    "max_reuse",
    "redis_url",
    "auth_token",
)


def table(only: tuple[str, ...] | None = None) -> str:
    """The markdown table of every setting (``only``: of those, in that order)."""
    rows = ["| variable | used by | default | description |", "|---|---|---|---|"]
    names: list[str] = list(CommonSettings.model_fields)
    for cls in SERVICES.values():
        names += [n for n in cls.model_fields if n not in names]
    for name in only or names:
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
    for old, replacements in {} if only else DEPRECATED.items():
        users = [svc for svc, cls in SERVICES.items() if any(new in cls.model_fields for new in replacements)]
        new = " and ".join(f"`{ENV_PREFIX}{n.upper()}` ({what})" for n, what in replacements.items())
        rows.append(
            f"| `{ENV_PREFIX}{old.upper()}` | {', '.join(users)} | unset | Deprecated, will be removed: "
            f"supplies {new} where those are unset. |"
        )
    return "\n".join(rows)


ROOT = Path(__file__).resolve().parents[1]
TABLES = {ROOT / "docs" / "configuration.md": None, ROOT / "README.md": FIRST}  # file -> its rows (None: all)


def update(path: Path, only: tuple[str, ...] | None) -> bool:
    """Rewrite the table between the markers; return True if the file changed."""
    text = path.read_text()
    new = re.sub(f"{re.escape(START)}.*?{re.escape(END)}", f"{START}\n{table(only)}\n{END}", text, flags=re.S)
    if new != text:
        path.write_text(new)
    return new != text


if __name__ == "__main__":
    for path, only in TABLES.items():
        print(f"{path.relative_to(ROOT)}: settings table", "updated" if update(path, only) else "up to date")
