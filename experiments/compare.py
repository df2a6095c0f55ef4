"""``make experiment``: asynchronous TB against the synchronous on-policy baseline, same machine, same budget.

Runs ``tba up`` once per arm on the same cached SFT base, then writes
``runs/experiment/results.md`` (the table) and ``comparison.png`` (held-out
accuracy against wall-clock time for every arm). Arms:

- ``async-tb``: the system as ``tba up`` runs it (TB loss, replay, searchers paced to one batch per
  policy version, since they share the cores with the trainer);
- ``plain-tb``: the bare baseline, synchronous TB in one process (``experiments/plain_loop.py``);
- ``sync-tb`` / ``sync-grpo``: the trainer samples only its current version and
  waits for it (checkpoint every step), the classic on-policy loop;
- ``countdown-*``: diversity on a multi-answer task (distinct correct answers per prompt).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ARMS = {
    "async-tb": {"task": "arithmetic", "mode": "async", "loss": "tb"},
    "plain-tb": {"task": "arithmetic", "mode": "sync", "loss": "tb", "plain": True},
    "sync-tb": {"task": "arithmetic", "mode": "sync", "loss": "tb"},
    "sync-grpo": {"task": "arithmetic", "mode": "sync", "loss": "grpo"},
    "countdown-async-tb": {"task": "countdown", "mode": "async", "loss": "tb"},
    "countdown-sync-grpo": {"task": "countdown", "mode": "sync", "loss": "grpo"},
}


def run_arm(name: str, cfg: dict, minutes: float, searchers: int, out: Path) -> dict:
    """One ``tba up`` run; extra settings of the arm (``cfg["env"]``) go in as TBA_ variables."""
    run_dir = out / name
    summary = run_dir / "summary.json"
    if summary.exists():  # resumable: a finished arm is not run again
        return json.loads(summary.read_text())
    if cfg.get("plain"):
        cmd = [sys.executable, "-m", "experiments.plain_loop", "--minutes", str(minutes), "--out", str(run_dir),
               "--task", cfg["task"]]
    else:
        cmd = [sys.executable, "-m", "tba.cli", "up", "--no-console", "--searchers", str(searchers),
               "--minutes", str(minutes), "--run-dir", str(run_dir), "--task", cfg["task"],
               "--mode", cfg["mode"], "--loss", cfg["loss"]]
    print("running", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True, env={**os.environ, "TBA_TASK": cfg["task"], **cfg.get("env", {})})
    return json.loads(summary.read_text())


def diversity(run_dir: Path, task: str) -> float | None:
    """Mean distinct correct answers per held-out prompt among 16 samples, on the last checkpoint."""
    from tba.checkpoints import CheckpointStore
    from tba.evaluate import evaluate_checkpoint

    store = CheckpointStore(run_dir / "checkpoints")
    manifest = store.read_manifest()
    if manifest is None:
        return None
    result = evaluate_checkpoint(store.verify(manifest), task, n_prompts=100, samples=16)
    return result.get("distinct_correct")


def time_to_target_ratios(results: dict[str, dict]) -> list[tuple[str, str, str]]:
    """Each asynchronous arm against each synchronous one on the same task: t_async / t_sync."""
    out = []
    for a, sa in results.items():
        for b, sb in results.items():
            if ARMS[a]["mode"] == "async" and ARMS[b]["mode"] == "sync" and ARMS[a]["task"] == ARMS[b]["task"]:
                ta, tb = sa.get("time_to_target"), sb.get("time_to_target")
                ratio = "n/a (not reached)" if ta is None or tb is None else f"{ta / tb:.2f}"
                out.append((a, b, ratio))
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--searchers", type=int, default=2)
    parser.add_argument("--out", type=Path, default=Path("runs/experiment"))
    parser.add_argument("--arms", nargs="*", default=list(ARMS))
    parser.add_argument("--target", type=float, default=0.5, help="Accuracy for the time-to-target ratio.")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    results = {name: run_arm(name, ARMS[name], args.minutes, args.searchers, args.out) for name in args.arms}

    # One held-out evaluation moves by +-10 points between checks on this tiny model: the peak and the
    # end are reported with the mean of the last five evaluations beside them.
    header = (f"| arm | steps | acc start | peak | mean of last 5 | end | time to {args.target:.0%} (s) "
              "| distinct correct / prompt |")
    lines = [header, "|---|---|---|---|---|---|---|---|"]
    for name, s in results.items():
        acc = [e["accuracy"] for e in s["evaluations"]]
        t = next((e["t"] for e in s["evaluations"] if e["accuracy"] >= args.target), None)
        div = diversity(args.out / name, ARMS[name]["task"]) if ARMS[name]["task"] == "countdown" else None
        s["time_to_target"], s["distinct_correct"] = t, div
        lines.append(f"| {name} | {s.get('trainer_steps')} | {acc[0]:.1%} | {max(acc):.1%} | "
                     f"{sum(acc[-5:]) / len(acc[-5:]):.1%} | {acc[-1]:.1%} | {'-' if t is None else round(t)} | "
                     f"{'-' if div is None else round(div, 2)} |")
    ratios = time_to_target_ratios(results)
    lines += [""] + [f"time to {args.target:.0%}: {a} / {b} = {r}" for a, b, r in ratios]
    (args.out / "results.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for name, s in results.items():
        ev = s["evaluations"]
        ax.plot([e["t"] for e in ev], [e["accuracy"] for e in ev], "o-", label=name)
    ax.set_xlabel("wall-clock seconds")
    ax.set_ylabel("held-out greedy accuracy")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.savefig(args.out / "comparison.png", dpi=90, bbox_inches="tight")
    return 0


if __name__ == "__main__":
    sys.exit(main())
