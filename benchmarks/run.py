"""Run every benchmark part that exists (buffer, trainer, searcher, episodes, lora, fsdp, evaluate, in that order);
one table.

``python -m benchmarks.run [--model M [--quick]] [PART ...]``: with ``--model`` (a model directory, or a
packaged model's name, fetched and cached on first use) the parts that depend on the model
(:data:`MODEL_PARTS`) measure that pretrained model; buffer and evaluate have no model-specific figures
and are skipped with a note (their figures do not depend on ``--model``: run them without it).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import sys
import time
from pathlib import Path

from benchmarks import Figure, format_table

PARTS = ("buffer", "trainer", "searcher", "episodes", "lora", "fsdp", "evaluate")
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
    args = parser.parse_args(argv)
    if args.quick and not args.model:
        parser.error("--quick applies to --model runs only")
    return args


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
        t0 = time.perf_counter()
        print(f"[bench] {part} ...", flush=True)
        try:
            figures += importlib.import_module(f"benchmarks.{part}").main(**kwargs) or []
        except Exception as err:  # noqa: BLE001 (one broken part must not hide the others' figures)
            failed.append(part)
            print(f"[bench] {part} FAILED: {type(err).__name__}: {err}", flush=True)
        print(f"[bench] {part} took {time.perf_counter() - t0:.0f} s", flush=True)
    print()
    print(format_table(figures))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
