"""Where the project keeps the models it makes or imports (the SFT bases, the red-team judge, imported
models): one directory, ``TBA_CACHE_DIR`` or ``~/.cache/tba/models``."""

from __future__ import annotations

import os
from pathlib import Path


def default_cache_root() -> Path:
    return Path(os.environ.get("TBA_CACHE_DIR") or Path.home() / ".cache" / "tba" / "models").expanduser()
