"""``make demo``'s runs as data: add a finished run to docs/results/data/demo/demo-runs.json and rebuild the pages.

``make demo`` (``tba up`` with its defaults, 10 minutes) leaves its figures in ``runs/<timestamp>/summary.json``.
This adds them to the record of every demo run, with where and with what code the run was made, and the
settings it was started with beyond the defaults (``--setting TBA_NAME=VALUE``, repeatable; none for
``make demo`` as typed). docs/results/demo.md and README's ``make demo`` row come from that record.

``python -m experiments.demo RUN_DIR [--command "make demo"] [--setting TBA_NAME=VALUE ...]``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from experiments.arms import curve, time_to, write_record
from experiments.records import RESULTS, SCHEMA, provenance

RECORD = "demo-runs"
TARGETS = (0.5, 0.9)


def run_entry(summary: dict, command: str, deviations: dict[str, str]) -> dict:
    """One run of the demo record, from its summary.json and this machine's provenance."""
    here = provenance()
    ev = summary["evaluations"]
    return {
        "date": here["date"],
        "commit": here["commit"],
        "dirty": here["dirty"],
        "machine": here["machine"],
        "command": command,
        "deviations": dict(sorted(deviations.items())),
        "accuracy": {"start": ev[0]["accuracy"], "end": ev[-1]["accuracy"]},
        "time_to": {str(t): time_to(ev, t) for t in TARGETS},
        "trainer_steps": summary.get("trainer_steps"),
        "evaluations": curve(summary),
    }


def empty_record() -> dict:
    return {
        "schema": SCHEMA,
        "experiment": "demo",
        "task": "arithmetic",
        "minutes": 10.0,
        "command": "make demo",
        "targets": {"0.5": 120, "0.9": "end"},
        "evaluation": {"every_s": 30, "after_run": False, "prompts": 200, "times": "from launch"},
        "runs": [],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m experiments.demo", description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", type=Path, help="A finished run's directory (runs/<timestamp>).")
    parser.add_argument("--command", default="make demo", help="How the run was started (default: make demo).")
    parser.add_argument("--setting", action="append", default=[], metavar="TBA_NAME=VALUE", help="Repeatable.")
    parser.add_argument("--results", type=Path, default=RESULTS, help="The results folder.")
    args = parser.parse_args(argv)
    summary = json.loads((args.run_dir / "summary.json").read_text())
    if summary.get("state", "complete") != "complete" or not summary.get("evaluations"):
        parser.error(f"{args.run_dir}: not a finished run with evaluations")
    deviations = dict(s.partition("=")[::2] for s in args.setting)
    path = args.results / "data" / "demo" / f"{RECORD}.json"
    record = json.loads(path.read_text()) if path.exists() else empty_record()
    record["runs"].append(run_entry(summary, args.command, deviations))
    write_record(args.results, "demo", RECORD, record)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
