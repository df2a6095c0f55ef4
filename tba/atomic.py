"""Files a reader may open at any moment (run.json, summary.json, a service's resolved settings): written aside
and renamed over the old one, so a reader, or a kill at any moment, finds the whole file or the previous one."""

from __future__ import annotations

import os
from pathlib import Path


def write_text(path: Path, text: str) -> Path:
    """``path`` holding ``text``, replaced in one rename (its directory is made if missing)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
    return path
