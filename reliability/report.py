"""RELIABILITY.md, assembled from sections: each suite (chaos, fuzz, soak, security) rewrites its own.

A section lives between ``<!-- section: NAME -->`` and ``<!-- /section: NAME -->``; writing one
leaves every other section as the last run of its suite left it, so the file always shows the
newest figures of each suite with the command and date that produced them. With ``--result FILE``
a suite also writes what it found as JSON (:func:`write_result`): what the test suite reads.
"""

from __future__ import annotations

import dataclasses
import json
import os
import platform
import re
import shlex
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPORT = Path(__file__).resolve().parent.parent / "RELIABILITY.md"
ORDER = ("chaos", "fuzz", "soak", "security")
HEADER = """# Reliability

What the reliability suite tried against the real system (real Redis, real vLLM CPU build, real
checkpoints), how many times, and what came of it. Each section is rewritten by its own target:
`make chaos`, `make fuzz`, `make soak`, `make security`; the test suite runs a short form of each and
asserts the same pass criteria, without touching this file.
"""


def _markers(name: str) -> tuple[str, str]:
    return f"<!-- section: {name} -->", f"<!-- /section: {name} -->"


def read_sections(path: Path = REPORT) -> dict[str, str]:
    """The sections the file holds now, by name (their text without the markers)."""
    if not path.exists():
        return {}
    text = path.read_text()
    found = re.findall(r"<!-- section: (\w+) -->\n(.*?)<!-- /section: \1 -->", text, flags=re.S)
    return {name: body for name, body in found}


def write_section(name: str, body: str, command: str, path: Path = REPORT) -> Path:
    """Replace section ``name`` with ``body`` (markdown), stamped with the command and the machine."""
    if name not in ORDER:
        raise ValueError(f"unknown section {name!r}; known: {', '.join(ORDER)}")
    stamp = f"_`{command}` on {time.strftime('%Y-%m-%d %H:%M %Z')}, {platform.machine()}, {os.cpu_count()} CPUs._\n\n"
    sections = read_sections(path)
    sections[name] = stamp + body.strip() + "\n"
    parts = [HEADER]
    for key in ORDER:
        if key in sections:
            start, end = _markers(key)
            parts.append(f"{start}\n{sections[key]}{end}\n")
    tmp = path.with_suffix(".tmp")
    tmp.write_text("\n".join(parts))
    tmp.replace(path)
    return path


def table(header: list[str], rows: list[list[object]]) -> str:
    """A markdown table."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def finish(name: str, text: str, problems: Sequence[str], argv: Sequence[str], write: bool) -> int:
    """The end of every suite's run: its section printed (and written to RELIABILITY.md unless ``write`` is
    false, stamped with the command that ran it), each missed criterion on stderr, the verdict; returns the
    exit status."""
    print(text)
    if write:
        command = f"python -m reliability.{name} {shlex.join(argv)}" if argv else f"make {name}"
        print(f"{name}: wrote {write_section(name, text, command)}")
    for problem in problems:
        print(f"{name}: FAIL: {problem[:2000]}", file=sys.stderr)
    print(f"{name}: {'FAIL' if problems else 'PASS'}")
    return 1 if problems else 0


def plain(value: Any) -> Any:
    """``value`` as JSON can hold it: dataclasses as objects, keys as strings, sets and tuples as lists,
    paths as strings (``dataclasses.asdict`` would rebuild a Counter from its items, counting them)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [plain(v) for v in (sorted(value, key=str) if isinstance(value, set | frozenset) else value)]
    if isinstance(value, Path):
        return str(value)
    return value


def write_result(path: Path, result: Any, problems: Sequence[str], **extra: Any) -> None:
    """A suite's result as JSON at ``path``: its fields, ``extra`` figures, every missed criterion
    (``problems``) and the verdict (``passed``)."""
    data = {**plain(result), **plain(extra), "problems": list(problems), "passed": not problems}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1) + "\n")
