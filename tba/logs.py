"""Logging for every service: console lines for people, JSON lines for collectors."""

from __future__ import annotations

import json
import logging
import os
import sys
import time


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out = {
            "ts": round(time.time(), 3),
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):
            out.update(fields)
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


def setup_logging(level: str = "INFO", json_lines: bool = False) -> None:
    handler = logging.StreamHandler(sys.stderr)
    if json_lines:
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s", "%H:%M:%S"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    # One line per HTTP request drowns everything else (tba up polls every second).
    logging.getLogger("httpx").setLevel(logging.WARNING)


def silence_progress_bars() -> None:
    """Turn off the progress bars transformers and huggingface_hub draw while loading and saving models:
    in a console that shows something else (tba up's live panels, a service's log) they are noise."""
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")  # read at import; inherited by child processes
    if "transformers" in sys.modules:  # imported already: its switch was read, turn it off directly
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
