"""The end of a local run: ``summary.json`` and a self-contained HTML report.

Plots come from what the run recorded: the trainer's per-step metrics file,
the held-out evaluations, and the timeline the observer polled. The HTML embeds
its PNGs, so the run directory can be copied or attached as it is.
"""

from __future__ import annotations

import base64
import html
import io
import json
import time
from collections import Counter
from pathlib import Path
from typing import Any


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except ValueError:
            continue  # a line cut by a kill: skip it
    return rows


def time_to_accuracy(evals: list[dict[str, Any]], target: float) -> float | None:
    """Seconds from the run's start until held-out accuracy first reached ``target``."""
    for e in evals:
        if e["accuracy"] >= target:
            return e["t"]
    return None


def build_summary(run, observer, final_stats: dict[str, Any]) -> dict[str, Any]:
    evals = run.evals
    versions = sorted({v for _, v in observer.versions_published})
    steps = read_jsonl(run.run_dir / "trainer_metrics.jsonl")
    return {
        "task": run.args.task,
        "mode": run.args.mode,
        "loss": run.args.loss,
        "searchers": run.args.searchers,
        "versions_published": versions,
        "searcher_versions": final_stats.get("searcher_versions", {}),
        "groups_published": final_stats.get("stream_entries_added"),
        "groups_stored": final_stats.get("groups_stored"),
        "buffer": {k: v for k, v in final_stats.items() if k != "searcher_versions"},
        "trainer_steps": steps[-1].get("step") if steps else None,
        "accuracy_start": evals[0]["accuracy"] if evals else None,
        "accuracy_end": evals[-1]["accuracy"] if evals else None,
        "evaluations": evals,
        "time_to_accuracy_s": {f"{t:.2f}": time_to_accuracy(evals, t) for t in (0.4, 0.5, 0.6, 0.7, 0.8, 0.9)},
        "restarts": {c.name: c.restarts for c in run.sup.children if c.restarts},
        "events": run.sup.events,
        "wall_seconds": round(time.time() - run.t0, 1),
    }


def _png(fig) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
    return base64.b64encode(buf.getvalue()).decode()


def _plots(run_dir: Path, evals: list[dict[str, Any]], t0: float) -> dict[str, str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = read_jsonl(run_dir / "trainer_metrics.jsonl")
    for s in steps:  # the trainer stamps Unix time; the report counts from the run's start
        s["t"] = s.get("ts", t0) - t0
    timeline = read_jsonl(run_dir / "timeline.jsonl")
    figs: dict[str, str] = {}

    fig, axes = plt.subplots(1, 2, figsize=(11, 3.5))
    if steps:
        axes[0].plot([s.get("t", 0) for s in steps], [s.get("reward_mean") for s in steps], label="batch reward")
        axes[1].plot([s.get("step") for s in steps], [s.get("reward_mean") for s in steps], label="batch reward")
    if evals:
        axes[0].plot([e["t"] for e in evals], [e["accuracy"] for e in evals], "o-", label="held-out accuracy")
        axes[1].plot([e["version"] for e in evals], [e["accuracy"] for e in evals], "o-", label="held-out accuracy")
    axes[0].set_xlabel("wall-clock seconds")
    axes[1].set_xlabel("trainer step (version)")
    for ax in axes:
        ax.set_ylim(0, 1.02)
        ax.grid(alpha=0.3)
        ax.legend()
    figs["Reward and held-out accuracy"] = _png(fig)
    plt.close(fig)

    fig, axes = plt.subplots(1, 3, figsize=(14, 3.2))
    ts = [r["t"] for r in timeline]
    sized = [(r["t"], (r.get("buffer") or {}).get("samples")) for r in timeline]
    sized = [(t, n) for t, n in sized if n is not None]  # a missed poll is a gap, not an empty buffer
    axes[0].plot([t for t, _ in sized], [n for _, n in sized])
    axes[0].set_title("buffer size (samples)")
    stale: Counter[int] = Counter()
    for s in steps:
        for k, v in (s.get("staleness_hist") or {}).items():
            stale[int(k)] += int(v)
    if stale:
        xs = sorted(stale)
        axes[1].bar(xs, [stale[x] for x in xs])
    axes[1].set_title("staleness of trained samples (versions)")
    searcher_rate = [sum((st.get("samples_per_s") or 0) for st in (r.get("searchers") or {}).values())
                     for r in timeline]
    axes[2].plot(ts, searcher_rate, label="searchers samples/s")
    axes[2].plot([s.get("t", 0) for s in steps], [s.get("samples_per_s") or 0 for s in steps],
                 label="trainer samples/s")
    axes[2].set_title("throughput")
    axes[2].legend()
    for ax in (axes[0], axes[2]):
        ax.set_xlabel("wall-clock seconds")
    figs["Buffer, staleness, throughput"] = _png(fig)
    plt.close(fig)
    return figs


def write_report(run_dir: Path, summary: dict[str, Any], t0: float) -> Path:
    figs = _plots(run_dir, summary["evaluations"], t0)
    rows = "".join(
        f"<tr><th>{html.escape(k)}</th><td>{html.escape(json.dumps(v))}</td></tr>"
        for k, v in summary.items() if k not in ("evaluations", "buffer")
    )
    imgs = "".join(f"<h2>{html.escape(t)}</h2><img src='data:image/png;base64,{b}'>" for t, b in figs.items())
    page = (
        "<!doctype html><meta charset='utf-8'><title>TBA run report</title>"
        "<style>body{font-family:sans-serif;margin:2em;max-width:1100px}td,th{padding:2px 8px;text-align:left;"
        "border-bottom:1px solid #ddd;font-size:13px}img{max-width:100%}</style>"
        f"<h1>TBA run: {html.escape(summary['task'])}, {summary['mode']} {summary['loss']}</h1>"
        f"<p>held-out greedy accuracy {summary['accuracy_start']} → {summary['accuracy_end']} "
        f"in {summary['wall_seconds']} s</p><table>{rows}</table>{imgs}"
    )
    out = run_dir / "report.html"
    out.write_text(page)
    return out

