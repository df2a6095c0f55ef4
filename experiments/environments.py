"""Multi-turn training on the CPU: the shipped calculator task (a tool the model calls, the calculator's
answers as environment tokens) learned by the tiny model with TB.

One arm, the system as ``make demo`` runs it (``tba up``: 2 searchers and the trainer sharing both cores)
on ``--task calculator``, from the task's own SFT base (it already calls the calculator; it adds poorly).
Reported per seed: held-out greedy accuracy at the start and the end and its lowest, times to 50/70/90%,
trainer steps, and what the searchers' episodes held: model turns and environment tokens per trajectory,
episodes that failed. The searcher's cost of the environment loop against single-turn generation of the
same length is ``python -m benchmarks.run episodes``.

Recorded under docs/results/data/environments/ and rendered into docs/results/environments.md.

Run alone: ``python -m experiments.environments [--seeds 3] [--minutes 10]``.
"""

from __future__ import annotations

from pathlib import Path

from experiments.arms import Arm, curve, parse_args, run_interleaved, spread, time_to, write_record
from experiments.records import provenance, record_name, summarize
from tba.local.report import read_jsonl

ARMS = [Arm("calculator-tb", task="calculator", searchers=2, eval_every=30.0)]
TARGETS = (0.5, 0.7, 0.9)


def episode_figures(run_dir: Path) -> dict[str, float]:
    """The searchers' episodes over the run, from the last status the run polled of each."""
    last: dict[str, dict] = {}
    for snap in read_jsonl(run_dir / "timeline.jsonl"):
        for name, status in (snap.get("searchers") or {}).items():
            if status.get("episodes"):
                last[name] = status
    episodes = sum(s["episodes"] for s in last.values())
    if not episodes:
        return {"episodes": 0, "turns": 0.0, "env_tokens": 0.0, "failed": 0}
    return {
        "episodes": episodes,
        "turns": sum(s["episode_turns"] for s in last.values()) / episodes,
        "env_tokens": sum(s["env_tokens"] for s in last.values()) / episodes,
        "failed": sum(sum(s["episode_failures"].values()) for s in last.values()),
    }


def record(summaries: list[dict], figures: list[dict[str, float]], minutes: float) -> dict:
    """The experiment's record (experiments/records.py): per seed the accuracies, times to the targets, steps and
    what the episodes held; their spreads; the held-out curves."""
    runs = []
    for s, f in zip(summaries, figures, strict=True):
        ev = s["evaluations"]
        runs.append(
            {
                "seed": s["seed"],
                "accuracy": {
                    "start": ev[0]["accuracy"],
                    "lowest": min(e["accuracy"] for e in ev),
                    "end": ev[-1]["accuracy"],
                },
                "time_to": {str(t): time_to(ev, t) for t in TARGETS},
                "trainer_steps": s.get("trainer_steps") or 0,
                **f,
                "evaluations": curve(s),
            }
        )
    return {
        **provenance(),
        "experiment": "environments",
        "task": ARMS[0].task,
        "minutes": minutes,
        "command": f"python -m experiments.environments --seeds {len(summaries)} --minutes {minutes:g}",
        "targets": list(TARGETS),
        "evaluation": {"every_s": ARMS[0].eval_every, "after_run": False, "prompts": 200},
        "arm": {"name": ARMS[0].name, "searchers": ARMS[0].searchers, "placement": ARMS[0].placement},
        "summary": {
            "accuracy_start": summarize([r["accuracy"]["start"] for r in runs]),
            "accuracy_lowest": summarize([r["accuracy"]["lowest"] for r in runs]),
            "accuracy_end": summarize([r["accuracy"]["end"] for r in runs]),
            "time_to": {str(t): summarize([r["time_to"][str(t)] for r in runs]) for t in TARGETS},
            "trainer_steps": summarize([r["trainer_steps"] for r in runs]),
            "turns": summarize([r["turns"] for r in runs]),
            "env_tokens": summarize([r["env_tokens"] for r in runs]),
            "failed": summarize([r["failed"] for r in runs]),
        },
        "runs": runs,
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv, "environments", __doc__, minutes=10.0)
    runs = run_interleaved(ARMS, args.seeds, args.minutes, args.out)
    summaries = runs[ARMS[0].name]
    figures = [episode_figures(args.out / ARMS[0].name / f"seed-{s['seed']}") for s in summaries]
    rec = record(summaries, figures, args.minutes)
    write_record(args.results, "environments", record_name(ARMS[0].task, args.minutes, rec), rec)
    print(f"held-out accuracy at the end: {spread([r['accuracy']['end'] for r in rec['runs']], '{:.3f}')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
