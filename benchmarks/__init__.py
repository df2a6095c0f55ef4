"""Benchmarks (``make bench`` = ``python -m benchmarks.run``).

Each part is a module ``benchmarks/<part>.py`` with ``main() -> list[Figure]``; it
measures on this machine, in the same run, both our figure and a bare baseline,
so the ratio means something. Its ``settings(model, quick)`` says what it runs with.
:mod:`benchmarks.run` prints one table for all parts and writes each part's record
(experiments/records.py) under docs/results/data/<part>/, from which
``python -m experiments.report`` renders the results pages.

``--model`` (a model directory or a packaged model's name) measures the parts that depend on the
model (trainer, searcher) on that pretrained model instead of the tiny one: their ``main`` then takes
``model`` (the resolved directory) and ``quick`` (a smoke run: the fewest batches that exercise every
path; its figures mean nothing). Buffer and evaluate have no figures that depend on the model: with
``--model`` they are skipped with a note (:mod:`benchmarks.run`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Figure:
    """One measured figure; ``baseline`` (same unit, same run) gives the ratio; ``target`` is free text."""

    part: str
    name: str
    value: float
    unit: str
    baseline: float | None = None
    target: str = ""

    @property
    def ratio(self) -> float | None:
        return self.value / self.baseline if self.baseline else None

    def as_record(self) -> dict[str, Any]:
        """The figure as a record holds it (experiments/records.py); the part is the record's."""
        return {
            "name": self.name,
            "value": self.value,
            "unit": self.unit,
            "baseline": self.baseline,
            "ratio": self.ratio,
            "target": self.target,
        }


def format_table(figures: list[Figure]) -> str:
    rows = [("part", "figure", "value", "unit", "baseline", "ratio", "target")]
    for f in figures:
        rows.append(
            (
                f.part,
                f.name,
                _num(f.value),
                f.unit,
                _num(f.baseline) if f.baseline is not None else "",
                f"{f.ratio:.2f}" if f.ratio is not None else "",
                f.target,
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _num(x: float) -> str:
    if x == 0 or 0.01 <= abs(x) < 1e6:
        return f"{x:,.2f}" if abs(x) < 100 else f"{x:,.0f}"
    return f"{x:.3g}"


def model_label(model_dir: Path) -> str:
    """The model's name for figure labels: the import record's name, else the directory's."""
    from tba.model.importer import read_record

    try:
        return str(read_record(model_dir)["name"])
    except (OSError, ValueError, KeyError):
        return Path(model_dir).name
