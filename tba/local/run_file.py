"""A run's record of itself: ``run.json`` in its directory, and what ``tba up --print-config`` shows.

``run.json`` says what the run was, so that a figure taken from it can be reproduced: the code (commit and
dirty flag), the machine (CPU model, the flags that decide its arithmetic, cores) and the packages
(:mod:`tba.run_record`), the command and its flags, the profile and where it came from, and for every service
the variables the launcher gave it and, once the service has started, the settings it resolved from them
(each service writes those where ``TBA_SETTINGS_FILE`` points, ``config/<name>.json``, and
:func:`add_resolved_settings` folds them in). No secret is written: the token is left out, and every URL's
password is redacted.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tba.atomic import write_text
from tba.run_record import provenance
from tba.settings import redact_url

RUN_FILE = "run.json"
CONFIG_DIR = "config"
SECRETS = ("TBA_AUTH_TOKEN", "REDIS_PASSWORD")
OWN_PREFIXES = ("TBA_", "VLLM_")  # the variables a service reads of its environment


def public_env(env: dict[str, str]) -> dict[str, str]:
    """The variables of ``env`` that configure a service, without secrets (URLs redacted), sorted by name."""
    return {
        k: redact_url(v) if "://" in v else v
        for k, v in sorted(env.items())
        if k.startswith(OWN_PREFIXES) and k not in SECRETS
    }


def settings_file(run_dir: Path, service: str) -> Path:
    return run_dir / CONFIG_DIR / f"{service}.json"


def write(run_dir: Path, record: dict[str, Any]) -> Path:
    """``run.json`` rewritten whole (:func:`tba.atomic.write_text`: a reader never sees half of it)."""
    return write_text(run_dir / RUN_FILE, json.dumps(record, indent=1, default=str))


def start_record(run: dict[str, Any], profile: dict[str, Any], services: dict[str, dict[str, str]]) -> dict[str, Any]:
    """The record as a run starts: provenance, ``run`` (command, flags, seed, budget), ``profile`` (its file and
    the settings it gave), ``services`` (name -> the variables the launcher gave it)."""
    return {
        **provenance(),
        "run": run,
        "profile": profile,
        "services": {name: {"env": public_env(env)} for name, env in services.items()},
    }


def add_resolved_settings(run_dir: Path) -> dict[str, Any]:
    """Fold each service's ``config/<name>.json`` (the settings it resolved) into ``run.json``; returns it."""
    path = run_dir / RUN_FILE
    record = json.loads(path.read_text())
    for name, entry in record["services"].items():
        written = settings_file(run_dir, name)
        if written.is_file():
            entry["settings"] = json.loads(written.read_text())["settings"]
    write(run_dir, record)
    return record


def config_table(layers: dict[str, dict[str, tuple[str, str]]]) -> str:
    """``--print-config``'s text: per service, each variable ``tba up`` sets, its value and where it comes from."""
    lines = []
    for service, values in layers.items():
        lines.append(f"[{service}]")
        width = max((len(k) for k in values), default=0)
        for key, (value, source) in sorted(values.items()):
            lines.append(f"  {key.ljust(width)} = {value!r:<14}  # {source}")
        lines.append("")
    return "\n".join(lines)
