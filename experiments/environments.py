"""Multi-turn training on the CPU: the shipped calculator task (a tool the model calls, the calculator's
answers as environment tokens) learned by the tiny model with TB.

One arm, the system as ``make demo`` runs it (``tba up``: 2 searchers and the trainer sharing both cores)
on ``--task calculator``, from the task's own SFT base (it already calls the calculator; it adds poorly).
Reported per seed: held-out greedy accuracy at the start and the end and its lowest, times to 50/70/90%,
trainer steps, and what the searchers' episodes held: model turns and environment tokens per trajectory,
episodes that failed. The searcher's cost of the environment loop against single-turn generation of the
same length is ``python -m benchmarks.run episodes``.

Run alone: ``python -m experiments.environments [--seeds 3] [--minutes 10]``.
"""

from __future__ import annotations

from pathlib import Path

from experiments.arms import Arm, parse_args, plot_accuracy, run_interleaved, spread, time_to, write_markdown
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


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv, "environments", __doc__, minutes=10.0)
    runs = run_interleaved(ARMS, args.seeds, args.minutes, args.out)
    summaries = runs[ARMS[0].name]
    lines = [
        f"# Multi-turn: the calculator task, {args.minutes:g} minutes per run",
        "",
        f"`python -m experiments.environments --seeds {args.seeds} --minutes {args.minutes:g}`: `tba up --task "
        "calculator` (2 searchers and the trainer on the machine's 2 cores), held-out greedy accuracy on 200 "
        "prompts every 30 s, from the task's SFT base. Spread: mean ± sd (min-max, n) over seeds.",
        "",
        "| seeds | start | lowest | end | "
        + " | ".join(f"time to {t:.0%} (s)" for t in TARGETS)
        + " | trainer steps | model turns / trajectory | environment tokens / trajectory | failed episodes |",
        "|---|" + "---|" * (len(TARGETS) + 7),
    ]
    figures = [episode_figures(args.out / ARMS[0].name / f"seed-{s['seed']}") for s in summaries]
    evals = [s["evaluations"] for s in summaries]
    cells = [
        str(len(summaries)),
        spread([100 * e[0]["accuracy"] for e in evals], unit="%"),
        spread([100 * min(x["accuracy"] for x in e) for e in evals], unit="%"),
        spread([100 * e[-1]["accuracy"] for e in evals], unit="%"),
        *(spread([time_to(e, t) for e in evals], "{:.0f}") for t in TARGETS),
        spread([s.get("trainer_steps") or 0 for s in summaries], "{:.0f}"),
        spread([f["turns"] for f in figures], "{:.2f}"),
        spread([f["env_tokens"] for f in figures], "{:.2f}"),
        spread([f["failed"] for f in figures], "{:.0f}"),
    ]
    lines += ["| " + " | ".join(cells) + " |", ""]
    for s, e in zip(summaries, evals, strict=True):
        lines.append(
            f"- seed {s['seed']}: "
            + " → ".join(f"{x['accuracy']:.1%}" for x in e[:: max(1, len(e) // 8)])
            + f" → {e[-1]['accuracy']:.1%}"
        )
    plot = f"environments-{args.minutes:g}min.png"
    lines += ["", f"![held-out accuracy against time]({plot})", ""]
    plot_accuracy(runs, args.results / plot, f"Calculator (multi-turn), tiny model, {args.minutes:g} min")
    write_markdown(args.results / f"environments-{args.minutes:g}min.md", lines)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
