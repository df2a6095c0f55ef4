"""Claim (3): on a sparse reward, more search finds more successes, and more distinct ones.

Task ``redteam`` (tba/tasks/redteam.py): the tiny arithmetic model, asked the arithmetic prompts, is
rewarded by a judge the project trains itself for completions that contain ``77`` (rare at the
start: the base model's samples rarely hold it). The paper's red-team setup: the TB loss with a
constant beta = 0.05 and a global buffer cap with the oldest samples evicted (``TBA_GLOBAL_CAPACITY``).

The trainer's budget is fixed (its own core, the same wall-clock time, the same policy versions:
a checkpoint every 32 steps, about 4 s); the search budget varies as the samples generated per
policy version: the searcher, on its own core, stops after 1, 2 or 4 batches of a version until the
next one (``TBA_MAX_BATCHES_PER_VERSION``). Training starts once the buffer holds 32 samples, which
one batch of the base model provides in every arm. Reported with spread over seeds:

- samples generated, successes found by the search and distinct successes (distinct texts), from
  the judge's record of every success the searcher scored;
- the policy's success rate at the end: 16 samples per held-out prompt, and greedy;
- the time until the greedy success rate first reaches 50 %.

Recorded under docs/results/data/redteam/ and rendered into docs/results/redteam.md.

Cost: 3 budgets x seeds x (minutes + ~1 min); 3 seeds at 6 minutes: ~65 min.
Run alone: ``python -m experiments.redteam [--seeds 3] [--minutes 6]``.
"""

from __future__ import annotations

import json
from pathlib import Path

from experiments.arms import Arm, curve, parse_args, run_interleaved, spread, time_to, write_record
from experiments.decoupling import PLACEMENT
from experiments.records import provenance, record_name, summarize

BUDGETS = (1, 2, 4)  # generation batches per policy version
TARGET = 0.5
SAMPLES = 16


def arms(out: Path) -> list[Arm]:
    from tba.model.sft import ensure_base_model

    base = ensure_base_model(task="arithmetic")  # the policy is the arithmetic model
    result = []
    for b in BUDGETS:
        options = {"successes_dir": str((out / f"search-x{b}" / "successes").resolve())}
        result.append(
            Arm(
                f"search-x{b}",
                task="redteam",
                **PLACEMENT,
                base_model=str(base),
                env={
                    "TBA_MAX_BATCHES_PER_VERSION": str(b),
                    "TBA_CHECKPOINT_EVERY": "32",
                    "TBA_WARMUP_SAMPLES": "32",
                    "TBA_BETA_START": "0.05",
                    "TBA_GLOBAL_CAPACITY": "20000",
                    "TBA_TASK_OPTIONS": json.dumps(options),
                },
            )
        )
    return result


def found(successes_dir: Path, since: float, until: float) -> dict:
    """Successes the searcher scored in [since, until] (a seed's own run): count and distinct texts."""
    texts = []
    for path in successes_dir.glob("successes-searcher-*.jsonl"):
        for line in path.read_text().splitlines():
            rec = json.loads(line)
            if since <= rec["t"] <= until:
                texts.append(rec["text"])
    return {"successes": len(texts), "distinct": len(set(texts))}


def policy(model_dir: Path) -> dict:
    """A policy's success rate on the held-out prompts: 16 samples each (at the searchers' temperature), greedy."""
    from tba.model.evaluation import evaluate_checkpoint

    return evaluate_checkpoint(model_dir, "redteam", n_prompts=200, samples=SAMPLES, pass_k=(1,))


def measure(summary: dict, run_dir: Path, successes_dir: Path) -> dict:
    checkpoints = run_dir / "checkpoints"  # a run that never trained left none: its policy is the base model
    end = policy(checkpoints if (checkpoints / "LATEST").exists() else Path(summary["base_model"]))
    start = summary["started_at"]
    return {
        **found(successes_dir, start, start + summary["wall_seconds"] + 60),
        "generated": summary["buffer"].get("samples_ingested", 0),
        "sampled_success": end["pass_at_k"]["1"],
        "greedy_success": end["greedy_accuracy"],
        "distinct_final": end["distinct_correct"],
        "time_to_target": time_to(summary["evaluations"], TARGET),
    }


def record(runs: dict[str, list[dict]], measures: dict[str, list[dict]], base: dict, minutes: float) -> dict:
    """The experiment's record (experiments/records.py): per search budget its runs' measures and their spreads."""
    seeds = len(next(iter(runs.values())))
    rec = {
        **provenance(),
        "experiment": "redteam",
        "task": "redteam",
        "minutes": minutes,
        "command": f"python -m experiments.redteam --seeds {seeds} --minutes {minutes:g}",
        "samples": SAMPLES,
        "target": TARGET,
        "base": {"sampled_success": base["pass_at_k"]["1"], "greedy_success": base["greedy_accuracy"]},
        "arms": {},
    }
    for b in BUDGETS:
        name = f"search-x{b}"
        figures = [
            {"seed": s["seed"], "trainer_steps": s.get("trainer_steps"), **m, "evaluations": curve(s)}
            for s, m in zip(runs[name], measures[name], strict=True)
        ]
        rec["arms"][name] = {
            "batches_per_version": b,
            "summary": {
                "distinct_final": summarize([f["distinct_final"] for f in figures]),
                "time_to_target": summarize([f["time_to_target"] for f in figures]),
            },
            "runs": figures,
        }
    return rec


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv, "redteam", __doc__, minutes=6.0)
    the_arms = arms(args.out)
    runs = run_interleaved(the_arms, args.seeds, args.minutes, args.out)
    measures = {
        arm.name: [
            measure(s, args.out / arm.name / f"seed-{s['seed']}", args.out / arm.name / "successes")
            for s in runs[arm.name]
        ]
        for arm in the_arms
    }
    rec = record(runs, measures, policy(Path(the_arms[0].base_model or "")), args.minutes)
    write_record(args.results, "redteam", record_name("redteam", args.minutes, rec), rec)
    for name, ms in measures.items():
        print(f"{name}: successes {spread([m['successes'] for m in ms], '{:.0f}')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
