"""Run every benchmark part that exists (cores, buffer, trainer, searcher, episodes, lora, fsdp, evaluate, in that
order); one table, and one record per part.

``python -m benchmarks.run [--model M [--quick]] [--records DIR] [PART ...]``: with ``--model`` (a model
directory, or a packaged model's name, fetched and cached on first use) the parts that depend on the model
(:data:`MODEL_PARTS`) measure that pretrained model; cores, buffer and evaluate have no model-specific figures
and are skipped with a note (their figures do not depend on ``--model``: run them without it).

Each part that ends writes its record to ``<records>/<part>/<name>.json`` (default docs/results/data; the
format is experiments/records.py's), as soon as it ends, so a run cut short keeps what it measured.
``python -m experiments.report`` renders the results pages from them.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any

from benchmarks import Figure, format_table, model_label
from experiments import records

PARTS = ("cores", "buffer", "trainer", "searcher", "episodes", "lora", "fsdp", "evaluate")
MODEL_PARTS = ("trainer", "searcher", "lora", "fsdp")  # the parts whose main() takes model= and quick=


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.run", description=__doc__.splitlines()[0])
    parser.add_argument("parts", nargs="*", metavar="PART", help=f"parts to run (default: {' '.join(PARTS)})")
    parser.add_argument(
        "--model",
        help="a model directory or a packaged model's name (e.g. smollm2-135m-instruct):"
        f" {', '.join(MODEL_PARTS)} measure it instead of the tiny model",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="with --model: a smoke run (fewest batches, every path once); figures mean nothing",
    )
    parser.add_argument(
        "--records",
        type=Path,
        default=records.DATA,
        metavar="DIR",
        help="where each part's record goes, as DIR/<part>/<name>.json (default: docs/results/data)",
    )
    args = parser.parse_args(argv)
    if args.quick and not args.model:
        parser.error("--quick applies to --model runs only")
    return args


def command(part: str, args: argparse.Namespace) -> str:
    """The command that measures this part again as it was measured."""
    flags = [f"--model {args.model}"] if args.model else []
    flags += ["--quick"] if args.quick else []
    return " ".join(["python -m benchmarks.run", *flags, part])


def record(
    part: str,
    module: ModuleType,
    figures: list[Figure],
    args: argparse.Namespace,
    model: Path | None,
    started: tuple[dict[str, Any], float, float],
) -> dict[str, Any]:
    """A part's record: the provenance taken when it started, what it ran with, its figures with their
    baselines and ratios. ``started``: (provenance, load average, perf_counter) at the start."""
    provenance, load, t0 = started
    name = None if part not in MODEL_PARTS else model_label(model) if model is not None else "tiny"
    return {
        "schema": provenance["schema"],
        "benchmark": part,
        "model": name,
        "quick": args.quick,
        "command": command(part, args),
        **{k: v for k, v in provenance.items() if k != "schema"},
        "load_average": [round(load, 2), round(os.getloadavg()[0], 2)],
        "seconds": round(time.perf_counter() - t0, 1),
        "settings": module.settings(model, args.quick),
        "figures": [f.as_record() for f in figures],
    }


def write(part: str, rec: dict[str, Any], root: Path) -> Path:
    """``<root>/<part>/<part>[-<model>]-<commit>-<cpu>[-quick].json``: named by what it measures."""
    subject = "-".join(filter(None, [part, records.slug(rec["model"]) if rec["model"] else ""]))
    return records.write(part, records.record_name(subject, None, rec, "quick" if rec["quick"] else ""), rec, root)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv if argv is not None else sys.argv[1:])
    model: Path | None = None
    if args.model:
        from tba.model.importer import resolve_model

        model = resolve_model(args.model)
        if not (model / "config.json").is_file():
            print(f"[bench] --model {args.model}: {model} holds no Hugging Face model (no config.json)", flush=True)
            return 2
    figures: list[Figure] = []
    failed = []
    for part in args.parts or list(PARTS):
        if importlib.util.find_spec(f"benchmarks.{part}") is None:
            print(f"[bench] {part}: no benchmarks/{part}.py, skipped", flush=True)
            continue
        if model is not None and part not in MODEL_PARTS:
            print(f"[bench] {part}: no figures that depend on --model, skipped (run it without --model)", flush=True)
            continue
        kwargs = {"model": model, "quick": args.quick} if model is not None else {}
        started = (records.provenance(), os.getloadavg()[0], time.perf_counter())
        print(f"[bench] {part} ...", flush=True)
        try:
            module = importlib.import_module(f"benchmarks.{part}")
            measured = module.main(**kwargs) or []
        except Exception as err:  # noqa: BLE001 (one broken part must not hide the others' figures)
            failed.append(part)
            print(f"[bench] {part} FAILED: {type(err).__name__}: {err}", flush=True)
        else:
            figures += measured
            path = write(part, record(part, module, measured, args, model, started), args.records)
            print(f"[bench] {part}: record {path}", flush=True)
        print(f"[bench] {part} took {time.perf_counter() - started[2]:.0f} s", flush=True)
    print()
    print(format_table(figures))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
