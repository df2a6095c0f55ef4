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

Recorded under docs/results/data/diversity/ and rendered into docs/results/diversity.md.

Cost: 2 arms x seeds x (minutes + ~1 min) plus ~1 min of evaluation per run; 3 seeds at 5 minutes:
~45 min. Run alone: ``python -m experiments.diversity [--seeds 3] [--minutes 5]``.
"""

from __future__ import annotations

from pathlib import Path

from experiments.arms import Arm, curve, parse_args, run_interleaved, spread, write_record
from experiments.decoupling import PLACEMENT
from experiments.records import provenance, record_name

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


def record(runs: dict[str, list[dict]], matched: float, measures: dict[str, list[dict]], minutes: float) -> dict:
    """The experiment's record (experiments/records.py): per run the measures at the end and at matched accuracy,
    its trainer steps and held-out curve."""
    seeds = len(next(iter(runs.values())))
    rec = {
        **provenance(),
        "experiment": "diversity",
        "task": TASK,
        "minutes": minutes,
        "command": f"python -m experiments.diversity --seeds {seeds} --minutes {minutes:g}",
        "samples": SAMPLES,
        "temperature": 0.7,
        "matched_accuracy": matched,
        "arms": {},
    }
    for arm in ARMS:
        rec["arms"][arm.name] = {
            "mode": arm.mode,
            "loss": arm.loss,
            "runs": [
                {
                    "seed": s["seed"],
                    "trainer_steps": s.get("trainer_steps"),
                    "matched_at": m["matched_at"],
                    "matched": {k: m["matched"][k] for k in ("distinct_correct", "sampled_accuracy")},
                    "end": m["end"],
                    "evaluations": curve(s),
                }
                for s, m in zip(runs[arm.name], measures[arm.name], strict=True)
            ],
        }
    return rec


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv, "diversity", __doc__, minutes=5.0)
    runs = run_interleaved(ARMS, args.seeds, args.minutes, args.out, keep_evaluated=True)
    matched, measures = analyse(runs, args.out)
    rec = record(runs, matched, measures, args.minutes)
    write_record(args.results, "diversity", record_name(TASK, args.minutes, rec), rec)
    for name, ms in measures.items():
        distinct = spread([m["end"]["distinct_correct"] for m in ms], "{:.2f}")
        print(f"{name}: distinct correct answers per prompt at the end {distinct}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
