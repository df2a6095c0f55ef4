"""``python -m experiments.report [--check]``: rebuild every results page from docs/results/data/."""

from __future__ import annotations

import argparse
import sys

from experiments import report
from experiments.records import ROOT


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m experiments.report", description=report.__doc__)
    parser.add_argument("--check", action="store_true", help="List what is stale against the data; write nothing.")
    args = parser.parse_args(argv)
    if args.check:
        stale = report.stale()
        for path in stale:
            print(f"stale: {path}")
        return 1 if stale else 0
    for path in report.write():
        print(f"wrote {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
