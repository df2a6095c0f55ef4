"""Claim (1): decoupling search from training speeds up wall-clock training.

The paper runs search and training on separate GPUs; here they get separate cores of one machine,
in every arm: the searcher (its vLLM engine, reference pass and scoring) on CPU 0, the trainer on
CPU 1 (``tba up --searcher-cpus 0 --trainer-cpus 1``; the run's own held-out evaluations share the
searcher's core). Both arms start from the same cached SFT base on two-digit addition and train
with the TB loss for the same wall-clock budget:

- ``async-tb``: the system as designed: the searcher runs free, the trainer draws from the replay
  buffer by the recency/reward rule and never waits for generation;
- ``sync-tb``: exactly on-policy: for each version the searcher generates one batch of the
  trainer's P prompts and then waits for the next version (``TBA_MAX_BATCHES_PER_VERSION=1``), the
  trainer trains on exactly those samples (``only_version``, drawn as generated) and publishes a
  checkpoint every step. Each core idles while the other works.

Reported per arm, with spread over seeds: time to 50/60/70 % held-out greedy accuracy, trainer
steps, accuracy at the end, and each core's busy fraction; the async/sync ratio of the times.

Cost: 2 arms x seeds x (minutes + ~1 min start-up and shutdown); 3 seeds at 10 minutes: ~66 min.
Run alone: ``python -m experiments.decoupling [--seeds 3] [--minutes 10]``.
"""

from __future__ import annotations

from pathlib import Path

from experiments.arms import (
    Arm,
    parse_args,
    plot_accuracy,
    ratio_spread,
    run_interleaved,
    spread,
    time_to,
    write_markdown,
)

TARGETS = (0.5, 0.6, 0.7)
PLACEMENT = {"searcher_cpus": "0", "trainer_cpus": "1"}
ARMS = [
    Arm("async-tb", mode="async", **PLACEMENT),
    Arm("sync-tb", mode="sync", env={"TBA_MAX_BATCHES_PER_VERSION": "1", "TBA_PROMPTS_PER_BATCH": "8"}, **PLACEMENT),
]


def report(runs: dict[str, list[dict]], minutes: float, results: Path) -> None:
    seeds = len(next(iter(runs.values())))
    lines = [
        f"# Claim (1): decoupling, {minutes:g} minutes per run, {seeds} seeds per arm",
        "",
        "Searcher on CPU 0, trainer on CPU 1 in both arms; same SFT base; held-out greedy accuracy on 200 "
        "prompts every 30 s. `python -m experiments.decoupling --seeds "
        f"{seeds} --minutes {minutes:g}`. Spread: mean ± sd (min-max, n) over seeds.",
        "",
        "| arm | "
        + " | ".join(f"time to {t:.0%} (s)" for t in TARGETS)
        + " | accuracy at the end | trainer steps | CPU 0 busy | CPU 1 busy |",
        "|---|" + "---|" * (len(TARGETS) + 4),
    ]
    for name, summaries in runs.items():
        cells = [spread([time_to(s["evaluations"], t) for s in summaries], "{:.0f}") for t in TARGETS]
        cells.append(spread([100 * s["evaluations"][-1]["accuracy"] for s in summaries], unit="%"))
        cells.append(spread([s.get("trainer_steps") or 0 for s in summaries], "{:.0f}"))
        for cpu in (0, 1):
            cells.append(spread([100 * s["cpu_busy"][cpu] for s in summaries], "{:.0f}", "%"))
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines += ["", "Time to target, async / sync (ratio of the mean times; range of the per-seed ratios):", ""]
    for t in TARGETS:
        a = [time_to(s["evaluations"], t) for s in runs["async-tb"]]
        b = [time_to(s["evaluations"], t) for s in runs["sync-tb"]]
        lines.append(f"- {t:.0%}: {ratio_spread(a, b)}")
    lines += ["", "Per run (seed: steps, accuracy start → end, times to targets in s):", ""]
    for name, summaries in runs.items():
        for s in summaries:
            ev = s["evaluations"]
            times = ", ".join(f"{time_to(ev, t):.0f}" if time_to(ev, t) is not None else "-" for t in TARGETS)
            lines.append(
                f"- {name} seed {s['seed']}: {s.get('trainer_steps')} steps, "
                f"{ev[0]['accuracy']:.1%} → {ev[-1]['accuracy']:.1%}, {times}"
            )
    lines += ["", "![accuracy against time](decoupling.png)"]
    write_markdown(results / "decoupling.md", lines)
    plot_accuracy(runs, results / "decoupling.png", "Decoupled (async) vs on-policy (sync) TB, separate cores")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv, "decoupling", __doc__)
    runs = run_interleaved(ARMS, args.seeds, args.minutes, args.out)
    report(runs, args.minutes, args.results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
