"""Run every benchmark part that exists (buffer, trainer, searcher, evaluate, in that order) and print one table."""

from __future__ import annotations

import importlib
import importlib.util
import sys
import time

from benchmarks import Figure, format_table

PARTS = ("buffer", "trainer", "searcher", "evaluate")


def main(argv: list[str] | None = None) -> int:
    wanted = (argv if argv is not None else sys.argv[1:]) or list(PARTS)
    figures: list[Figure] = []
    failed = []
    for part in wanted:
        if importlib.util.find_spec(f"benchmarks.{part}") is None:
            print(f"[bench] {part}: no benchmarks/{part}.py, skipped", flush=True)
            continue
        t0 = time.perf_counter()
        print(f"[bench] {part} ...", flush=True)
        try:
            figures += importlib.import_module(f"benchmarks.{part}").main() or []
        except Exception as err:  # noqa: BLE001 (one broken part must not hide the others' figures)
            failed.append(part)
            print(f"[bench] {part} FAILED: {type(err).__name__}: {err}", flush=True)
        print(f"[bench] {part} took {time.perf_counter() - t0:.0f} s", flush=True)
    print()
    print(format_table(figures))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
