"""The results' data format: one small JSON record per experiment run set, committed under docs/results/data/.

Every results page, docs/results/claims.json and README's results table are rendered from these records
(``python -m experiments.report``), so a figure is typed once, by the code that measured it. A record says
what was measured and where:

- ``experiment``, ``task``, ``minutes`` (the budget of each run), ``command`` (what reproduces it);
- ``date`` (ISO 8601), ``commit`` and ``dirty`` (the code measured; null where unknown), ``recorded_in`` (the
  commit that first recorded the figures, for records converted from earlier text; ``git show`` it for that text);
- ``machine``: ``cpu_model``, ``cpu_flags`` (those that decide the arithmetic: bf16, AMX, AVX-512), ``cores``
  (:mod:`tba.run_record`, which also fills every run's ``run.json``);
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
  with the same experiment's figures without it.

A benchmark's record (``python -m benchmarks.run`` writes one per part, under ``<data>/<part>/``) holds, beside
the provenance: ``benchmark`` (the part), ``model`` (``tiny``, a pretrained model's name, or null where the part
has no model), ``quick`` (a smoke run: its figures mean nothing), ``command``, ``load_average`` (the one-minute
load at the start and at the end: the machines are shared), ``seconds``, ``settings`` (what the part ran with),
``figures`` (each ``name``, ``value``, ``unit``, ``baseline`` (the bare baseline measured in the same run),
``ratio``, ``target``) and ``notes``. A record converted from text may give a value, a baseline, a ratio or the
load as ``[low, high]``: the range over its ``runs``. ``docker-smoke`` holds ``cases``, each a ``case``, its
``phases`` in seconds as scripts/docker-smoke.sh reports them (``SMOKE_REPORT``) and its ``total_seconds``;
``model-import`` holds what the import made of the model (``imported``).

Fractions are fractions (accuracy 0.873, not 87.3), times are seconds, learning rates are floats.
"""

from __future__ import annotations

import json
import re
import statistics
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from tba import run_record

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "docs" / "results"
DATA = RESULTS / "data"
SCHEMA = "tba.results/1"
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


def provenance() -> dict[str, Any]:
    """Where and with what code a record is being measured now: date, commit, dirty flag, machine, packages (the
    fields ``tba up`` writes into each run's ``run.json``, :mod:`tba.run_record`)."""
    now = run_record.provenance()
    return {
        "schema": SCHEMA,
        "date": now["date"],
        "commit": now["commit"][:7] if now["commit"] else None,
        "dirty": now["dirty"],
        "recorded_in": None,
        "machine": {k: now["machine"][k] for k in ("cpu_model", "cpu_flags", "cores")},
        "packages": now["packages"],
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


def record_name(task: str, minutes: float | None, record: dict[str, Any], extra: str = "") -> str:
    """A record's file name: what it measures (task or benchmark, budget where it has one), the code (commit), the
    CPU: never a machine's or a session's number."""
    ref = record.get("commit") or record.get("recorded_in") or "uncommitted"
    # "AMD EPYC, family 25 (AVX2)" -> amd-epyc-family-25
    cpu_name = re.sub(r"\(.*?\)|,", " ", record["machine"]["cpu_model"])
    parts = [task, "" if minutes is None else f"{minutes:g}min", ref, slug(cpu_name)[:40], extra]
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
