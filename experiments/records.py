"""The results' data format: one small JSON record per experiment run set, committed under docs/results/data/.

Every results page, docs/results/claims.json and README's results table are rendered from these records
(``python -m experiments.report``), so a figure is typed once, by the code that measured it. A record says
what was measured and where:

- ``experiment``, ``task``, ``minutes`` (the budget of each run), ``command`` (what reproduces it);
- ``date`` (ISO 8601), ``commit`` and ``dirty`` (the code measured; null where unknown), ``recorded_in`` (the
  commit that first recorded the figures, for records converted from earlier text; ``git show`` it for that text);
- ``machine``: ``cpu_model``, ``cpu_flags`` (those that decide the arithmetic: bf16, AMX, AVX-512), ``cores``;
- ``packages``: versions of the stack, where recorded;
- the experiment's own figures (each experiment's module says which), with spreads over seeds as
  :func:`summarize` makes them: ``{"mean", "sd", "min", "max", "n", "of"}``, ``n`` of ``of`` seeds having a value.

Each experiment's figures (its module says how each is measured):

- ``decoupling``: ``targets``, ``evaluation``, ``code_differences``; ``arms``: name -> ``mode``, ``deviations``
  (the settings in which the arm differs from the defaults), ``peak_lr``, ``summary`` (spreads of the times to
  each target, the end accuracy, steps, update-to-data, CPU busy) and ``runs`` (per seed: ``time_to``,
  ``accuracy`` start / lowest / end, ``step``, ``staleness``, ``sync_cycle``, ``evaluations`` [[s, accuracy]]);
  ``pairs``: async / sync ``time_ratio``, ``coarse_time_ratio``, ``samples_ratio`` per target; ``levers``: an
  arm against the arm (or ``against_record``'s arm) it changes, with its ``outcome``;
- ``diversity``: ``matched_accuracy``; per run the distinct correct answers and sampled accuracy at the end and
  at matched accuracy;
- ``redteam``: ``base``; per search budget its runs' samples generated, successes, distinct successes and
  success rates;
- ``environments``: ``summary`` and per run the accuracies, times to the targets, turns and environment tokens;
- ``demo``: one record of every ``make demo`` run (experiments/demo.py adds one);
- ``single-runs``: runs on shared cores with their curves; ``ablations/pilots``: levers measured in pilots, each
  with the same session's figures without it.

Fractions are fractions (accuracy 0.873, not 87.3), times are seconds, learning rates are floats.
"""

from __future__ import annotations

import json
import os
import platform
import re
import statistics
import subprocess
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "docs" / "results"
DATA = RESULTS / "data"
SCHEMA = "tba.results/1"
# The /proc/cpuinfo flags that decide a CPU's arithmetic here: bf16 generation needs avx512_bf16 or amx_bf16.
CPU_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile")
PACKAGES = ("torch", "vllm", "transformers", "peft")
WIDTH = 120  # the data files' line width: see dumps

Spread = dict[str, float | int | None]


def summarize(values: Sequence[float | None]) -> Spread:
    """The spread of the values that exist: mean, sd (0 for one value), min, max, and how many of all exist."""
    have = [float(v) for v in values if v is not None]
    if not have:
        return {"mean": None, "sd": None, "min": None, "max": None, "n": 0, "of": len(values)}
    return {
        "mean": statistics.mean(have),
        "sd": statistics.stdev(have) if len(have) > 1 else 0.0,
        "min": min(have),
        "max": max(have),
        "n": len(have),
        "of": len(values),
    }


def ratio(num: Sequence[float | None], den: Sequence[float | None]) -> Spread | None:
    """The ratio of the means of paired values (seed i against seed i), with the range of the per-pair ratios; pairs
    where either side is missing are left out; None where no pair has both."""
    pairs = [(a, b) for a, b in zip(num, den, strict=True) if a is not None and b is not None and b > 0]
    if not pairs:
        return None
    each = [a / b for a, b in pairs]
    mean = statistics.mean(a for a, _ in pairs) / statistics.mean(b for _, b in pairs)
    return {"mean": mean, "min": min(each), "max": max(each), "n": len(pairs)}


def git(*args: str) -> str | None:
    try:
        out = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=10, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip()


def cpu() -> dict[str, Any]:
    """The CPU model, the flags of :data:`CPU_FLAGS` it has, and the cores this process may use."""
    model, flags = "unknown", set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and model == "unknown":
                model = value.strip()
            elif key.strip() == "flags" and not flags:
                flags = set(value.split())
    except OSError:
        model = platform.processor() or "unknown"
    cores = len(os.sched_getaffinity(0))
    return {"cpu_model": model, "cpu_flags": [f for f in CPU_FLAGS if f in flags], "cores": cores}


def packages() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    found = {}
    for name in PACKAGES:
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            continue
    return found


def provenance() -> dict[str, Any]:
    """Where and with what code a record is being measured now: date, commit, dirty flag, machine, packages."""
    commit = git("rev-parse", "--short=7", "HEAD")
    status = git("status", "--porcelain", "--untracked-files=no")
    return {
        "schema": SCHEMA,
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "commit": commit,
        "dirty": None if status is None else bool(status),
        "recorded_in": None,
        "machine": cpu(),
        "packages": packages(),
    }


def resolved_settings(run_dir: Path) -> dict[str, Any] | None:
    """The settings ``tba up`` resolved for a run, from its ``run.json`` where the launcher wrote one."""
    path = run_dir / "run.json"
    if not path.exists():
        return None
    record = json.loads(path.read_text())
    return record.get("settings") or record.get("services")


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "unknown"


def record_name(task: str, minutes: float, record: dict[str, Any], extra: str = "") -> str:
    """A record's file name: what it measures (task, budget), the code (commit), the CPU: never a machine's or a
    session's number."""
    ref = record.get("commit") or record.get("recorded_in") or "uncommitted"
    # "AMD EPYC, family 25 (AVX2)" -> amd-epyc-family-25
    cpu_name = re.sub(r"\(.*?\)|,", " ", record["machine"]["cpu_model"])
    parts = [task, f"{minutes:g}min", ref, slug(cpu_name)[:40], extra]
    return "-".join(p for p in parts if p)


def dumps(value: Any, indent: str = "") -> str:
    """JSON with every object or list that fits in :data:`WIDTH` columns on one line: a run's figures read as
    one row, and a changed figure is a one-line diff."""
    flat = json.dumps(value, ensure_ascii=False)
    if len(indent) + len(flat) <= WIDTH or not isinstance(value, dict | list) or not value:
        return flat
    inner = indent + " "
    if isinstance(value, dict):
        items = [f"{inner}{json.dumps(k, ensure_ascii=False)}: {dumps(v, inner)}" for k, v in value.items()]
        return "{\n" + ",\n".join(items) + "\n" + indent + "}"
    return "[\n" + ",\n".join(inner + dumps(v, inner) for v in value) + "\n" + indent + "]"


def write(experiment: str, name: str, record: dict[str, Any], data: Path = DATA) -> Path:
    """``<data>/<experiment>/<name>.json`` (data: docs/results/data); returns its path."""
    path = data / experiment / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(dumps(record) + "\n")
    return path


def load(experiment: str, data: Path = DATA) -> Iterator[tuple[str, dict[str, Any]]]:
    """Every record of an experiment, oldest first: (name, record)."""
    records = [(p.stem, json.loads(p.read_text())) for p in sorted((data / experiment).glob("*.json"))]
    yield from sorted(records, key=lambda r: (r[1].get("date") or "", r[0]))
