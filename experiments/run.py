"""``make experiment``: the paper's three claims measured on this machine, one experiment after the other.

1. decoupling (experiments/decoupling.py): bounded async TB against exactly on-policy sync TB, search and
   training on separate cores; time to 50/60/70/80 % held-out accuracy (~100 min at 3 seeds x 5 and 10 min);
2. diversity (experiments/diversity.py): async TB against on-policy GRPO on a task with many correct
   answers per prompt; distinct correct answers at the end and at matched accuracy (~45 min at 3 seeds x 5 min);
3. redteam (experiments/redteam.py): a sparse reward from a learned judge; successes and distinct
   successes found as the search budget grows at a fixed trainer budget (~65 min at 3 seeds x 6 min).

Each writes its record under docs/results/data/, rebuilds the results pages from the records
(``python -m experiments.report``) and can be run alone (``python -m experiments.<name>``).
Finished runs are kept in runs/experiments/ and not run again, so an interrupted ``make experiment``
resumes where it stopped.
"""

from __future__ import annotations

import argparse

from experiments import decoupling, diversity, redteam

EXPERIMENTS = {"decoupling": decoupling, "diversity": diversity, "redteam": redteam}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=3, help="Seeds per arm (default 3; 1 for a quick look).")
    parser.add_argument(
        "--only", nargs="*", choices=list(EXPERIMENTS), default=list(EXPERIMENTS), help="Run only these experiments."
    )
    args = parser.parse_args(argv)
    for name in args.only:
        print(f"=== experiment {name} ===", flush=True)
        EXPERIMENTS[name].main(["--seeds", str(args.seeds)])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
