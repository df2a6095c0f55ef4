"""Claim (2): large-scale off-policy sampling with TB keeps more of the distinct correct answers.

Task ``sums`` (tba/tasks/sums.py): write n (100-999) as a + b, so each prompt has n // 2 distinct
correct answers. Both arms start from the same cached SFT base, search and training on separate
cores as in experiments/decoupling.py, the same wall-clock budget:

- ``async-tb``: the system as designed (TB, replay, a free-running searcher);
- ``sync-grpo``: GRPO exactly on-policy (each version's samples as generated, one checkpoint per step).

Measured after the runs, on copies of the checkpoints each run evaluated (``tba up --keep-evaluated``),
with 16 samples at the searchers' temperature (0.7) on every held-out prompt:

- distinct correct answers per prompt among the 16, and the sampled accuracy, at the end;
- the same at *matched accuracy*: for the highest greedy accuracy that every run reached, the first
  checkpoint of each run that reached it (diversity is only comparable at equal accuracy: a policy
  that is right less often has fewer correct answers to be distinct).

Cost: 2 arms x seeds x (minutes + ~1 min) plus ~1 min of evaluation per run; 3 seeds at 5 minutes:
~45 min. Run alone: ``python -m experiments.diversity [--seeds 3] [--minutes 5]``.
"""

from __future__ import annotations

from pathlib import Path

from experiments.arms import Arm, parse_args, plot_accuracy, run_interleaved, spread, write_markdown
from experiments.decoupling import PLACEMENT

TASK = "sums"
SYNC = {"TBA_MAX_BATCHES_PER_VERSION": "1", "TBA_PROMPTS_PER_BATCH": "8"}
ARMS = [
    Arm("async-tb", task=TASK, mode="async", loss="tb", **PLACEMENT),
    Arm("sync-grpo", task=TASK, mode="sync", loss="grpo", env=SYNC, **PLACEMENT),
]
SAMPLES = 16


def measure(model_dir: Path, samples: int = SAMPLES) -> dict:
    """Distinct correct answers per prompt and sampled accuracy of one checkpoint, on every held-out prompt."""
    from tba.model.evaluation import evaluate_checkpoint

    r = evaluate_checkpoint(model_dir, TASK, n_prompts=1000, samples=samples, pass_k=(1,), threads=0)
    return {
        "distinct_correct": r["distinct_correct"],
        "sampled_accuracy": r["pass_at_k"]["1"],
        "greedy_accuracy": r["greedy_accuracy"],
    }


def evaluated(summary: dict, run_dir: Path) -> list[tuple[float, Path]]:
    """(greedy accuracy, model directory) of each evaluation of a run, in time order."""
    out = []
    for e in summary["evaluations"]:
        path = Path(summary["base_model"]) if e["version"] == 0 else run_dir / "evaluated" / f"v{e['version']:06d}"
        if path.exists():
            out.append((e["accuracy"], path))
    return out


def analyse(runs: dict[str, list[dict]], out: Path) -> tuple[float, dict[str, list[dict]]]:
    """The matched accuracy level, and for every run its measures at the end and at that level."""
    history = {
        name: [evaluated(s, out / name / f"seed-{s['seed']}") for s in summaries] for name, summaries in runs.items()
    }
    matched = min(max(acc for acc, _ in h) for hs in history.values() for h in hs)
    measures: dict[str, list[dict]] = {}
    for name, hs in history.items():
        measures[name] = []
        for s, h in zip(runs[name], hs, strict=True):
            first = next(path for acc, path in h if acc >= matched)
            final = out / name / f"seed-{s['seed']}" / "checkpoints"  # the run's last checkpoint (LATEST)
            measures[name].append({"end": measure(final), "matched": measure(first), "matched_at": first.name})
    return matched, measures


def report(
    runs: dict[str, list[dict]], matched: float, measures: dict[str, list[dict]], minutes: float, results: Path
) -> None:
    seeds = len(next(iter(runs.values())))
    lines = [
        f"# Claim (2): diversity on `{TASK}`, {minutes:g} minutes per run, {seeds} seeds per arm",
        "",
        f"`python -m experiments.diversity --seeds {seeds} --minutes {minutes:g}`. {SAMPLES} samples per "
        "held-out prompt at temperature 0.7; spread: mean ± sd (min-max, n) over seeds. Matched accuracy: "
        f"{matched:.1%} greedy, the highest level every run reached; each run's first checkpoint at that level.",
        "",
        "| arm | distinct correct / prompt, end | sampled accuracy, end | distinct correct / prompt, matched "
        "| sampled accuracy, matched | greedy accuracy, end |",
        "|---|---|---|---|---|---|",
    ]
    for name, ms in measures.items():
        cells = [
            spread([m["end"]["distinct_correct"] for m in ms], "{:.2f}"),
            spread([100 * m["end"]["sampled_accuracy"] for m in ms], unit="%"),
            spread([m["matched"]["distinct_correct"] for m in ms], "{:.2f}"),
            spread([100 * m["matched"]["sampled_accuracy"] for m in ms], unit="%"),
            spread([100 * m["end"]["greedy_accuracy"] for m in ms], unit="%"),
        ]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines += ["", "Per run:", ""]
    for name, ms in measures.items():
        for s, m in zip(runs[name], ms, strict=True):
            lines.append(
                f"- {name} seed {s['seed']}: {s.get('trainer_steps')} steps; matched at "
                f"{m['matched_at']}: {m['matched']['distinct_correct']:.2f} distinct, "
                f"{m['matched']['sampled_accuracy']:.1%} sampled; end: {m['end']['distinct_correct']:.2f} "
                f"distinct, {m['end']['sampled_accuracy']:.1%} sampled, "
                f"{m['end']['greedy_accuracy']:.1%} greedy"
            )
    lines += ["", "![accuracy against time](diversity.png)"]
    write_markdown(results / "diversity.md", lines)
    plot_accuracy(runs, results / "diversity.png", f"{TASK}: async TB vs on-policy GRPO, separate cores")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv, "diversity", __doc__, minutes=5.0)
    runs = run_interleaved(ARMS, args.seeds, args.minutes, args.out, keep_evaluated=True)
    matched, measures = analyse(runs, args.out)
    report(runs, matched, measures, args.minutes, args.results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
