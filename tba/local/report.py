"""The end of a local run: ``summary.json`` and a self-contained HTML report.

The report is for a person: first a summary of the run in short lines (accuracy start to end, time
to each target, steps, samples generated / stored / duplicates, staleness, restarts and events),
then the plots, each series drawn raw and faint with a smoothed line on top. Long lists (every
version published, each searcher's versions) stay in ``summary.json``.

Plots come from what the run recorded: the trainer's per-step metrics file, the held-out
evaluations, and the timeline the observer polled. The HTML embeds its PNGs, so the run directory
can be copied or attached as it is.
"""

from __future__ import annotations

import base64
import html
import io
import json
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tba.local.cpu_usage import utilization
from tba.local.searcher_accounts import account_line, searcher_accounts, spans_as_dicts, warning_spans

TARGETS = (0.4, 0.5, 0.6, 0.7, 0.8, 0.9)
MAX_CELL = 120  # characters: a summary cell holds a short text, never a list


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


def staleness_counts(steps: list[dict[str, Any]]) -> Counter[int]:
    """How many trained samples were how many versions stale, over the given steps."""
    counts: Counter[int] = Counter()
    for s in steps:
        for k, v in (s.get("staleness_hist") or {}).items():
            counts[int(k)] += int(v)
    return counts


def mean(counts: Counter[int]) -> float | None:
    """The mean of a distribution given as value -> count."""
    total = sum(counts.values())
    return sum(k * v for k, v in counts.items()) / total if total else None


def quantile(counts: Counter[int], q: float) -> int | None:
    """The ``q`` quantile of a distribution given as value -> count (the smallest value reaching it)."""
    total = sum(counts.values())
    if total == 0:
        return None
    seen = 0
    for value in sorted(counts):
        seen += counts[value]
        if seen >= q * total:
            return value
    return max(counts)


@dataclass(frozen=True)
class RunFacts:
    """What the summary needs to know of a run: how it was started and what its supervisor saw."""

    run_dir: Path
    task: str
    mode: str
    loss: str
    searchers: int
    started_at: float  # Unix time of the run's start: the zero of every evaluation's ``t``
    evals: list[dict[str, Any]]
    restarts: dict[str, int]
    events: list[str]


def build_summary(run: RunFacts, versions_published: Iterable[int], final_stats: dict[str, Any]) -> dict[str, Any]:
    evals = run.evals
    steps = read_jsonl(run.run_dir / "trainer_metrics.jsonl")
    stale = staleness_counts(steps)
    timeline = read_jsonl(run.run_dir / "timeline.jsonl")
    spans = warning_spans(timeline)
    run_end = timeline[-1]["t"] if timeline else 0.0
    return {
        "task": run.task,
        "mode": run.mode,
        "loss": run.loss,
        "searchers": run.searchers,
        "versions_published": sorted(set(versions_published)),
        "searcher_versions": final_stats.get("searcher_versions", {}),
        "searcher_accounts": searcher_accounts(timeline, steps, final_stats),
        "time_split": time_split(timeline),
        "cpu_busy": utilization(timeline),
        "searcher_warnings": spans_as_dicts(spans),
        "groups_published": final_stats.get("stream_entries_added"),
        "groups_stored": final_stats.get("groups_stored"),
        "buffer": {k: v for k, v in final_stats.items() if k != "searcher_versions"},
        "trainer_steps": steps[-1].get("step") if steps else None,
        "staleness": {"mean": mean(stale), "p95": quantile(stale, 0.95), "max": max(stale) if stale else None},
        "accuracy_start": evals[0]["accuracy"] if evals else None,
        "accuracy_end": evals[-1]["accuracy"] if evals else None,
        "evaluations": evals,
        "time_to_accuracy_s": {f"{t:.2f}": time_to_accuracy(evals, t) for t in TARGETS},
        "restarts": run.restarts,
        "events": [*run.events, *(span.as_event(run_end) for span in spans)],
        "wall_seconds": round(time.time() - run.started_at, 1),
        "started_at": run.started_at,
    }


def time_split(timeline: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Where each service's time went, as its last ``/status`` in the timeline gave it (its ``time``): the
    trainer's parts of a step and its waits, each searcher's generation, reloads and paced waits."""
    out: dict[str, dict[str, Any]] = {}
    for row in timeline:
        if (row.get("trainer") or {}).get("time"):
            out["trainer"] = row["trainer"]["time"]
        for name, st in (row.get("searchers") or {}).items():
            if isinstance(st, dict) and st.get("time"):
                out[name] = st["time"]
    return out


def time_shares(split: dict[str, Any]) -> str:
    """Each part of one service's time split as its share of the wall time, e.g. "generate 97%, reload 2%"."""
    wall = split.get("wall_s") or 0.0
    return ", ".join(f"{k} {v / wall:.0%}" for k, v in (split.get("seconds") or {}).items() if wall and v)


def time_line(split: dict[str, Any]) -> str:
    """One service's time split as a report line: each part's share of the wall time."""
    wall = split.get("wall_s") or 0.0
    parts = time_shares(split)
    extra = f"; busy {split['busy_fraction']:.0%}" if "busy_fraction" in split else ""
    return f"{parts} of {wall:.0f} s{extra}"


# --- the summary a person reads first ---------------------------------------------------------------------


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.1%}"


def _count(x: Any) -> str:
    return f"{x:,}" if isinstance(x, int) else "-"


def samples_generated(timeline: list[dict[str, Any]]) -> int | None:
    """Completions the searchers generated: each searcher's last count (a restarted one starts again at 0,
    so its counts before the restart are added)."""
    total, last = 0, dict[str, int]()
    for row in timeline:
        for name, st in (row.get("searchers") or {}).items():
            n = st.get("samples_generated")
            if isinstance(n, int):
                if n < last.get(name, 0):  # restarted: keep what the previous life generated
                    total += last[name]
                last[name] = n
    return total + sum(last.values()) if last else None


def trained_line(buffer: dict[str, Any]) -> str:
    """How many of the distinct samples stored over the run the trainer drew at least once: what the searchers
    generated that went untrained (too stale by the time it was drawn, or never drawn)."""
    stored, trained = buffer.get("samples_stored_total"), buffer.get("samples_served_distinct")
    if not isinstance(stored, int) or not isinstance(trained, int):
        return "-"
    share = f" ({trained / stored:.0%})" if stored else ""
    return f"{_count(trained)} of {_count(stored)} stored{share}"


def summary_rows(summary: dict[str, Any], timeline: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """The report's first table: one short line per figure."""
    evals = summary.get("evaluations") or []
    best = max(evals, key=lambda e: e["accuracy"]) if evals else None
    reached = [f"{float(t):.0%} at {s:.0f} s" for t, s in summary["time_to_accuracy_s"].items() if s is not None]
    missed = [f"{float(t):.0%}" for t, s in summary["time_to_accuracy_s"].items() if s is None]
    b = summary.get("buffer") or {}
    ingested, duplicates = b.get("samples_ingested"), b.get("samples_duplicate")
    dup = (
        f" ({duplicates / ingested:.0%} of ingested)"
        if isinstance(ingested, int) and ingested and isinstance(duplicates, int)
        else ""
    )
    stale = summary.get("staleness") or {}
    restarts = ", ".join(f"{k} {v}x" for k, v in summary.get("restarts", {}).items()) or "none"
    versions = summary.get("versions_published") or []
    rows = [
        (
            "run",
            f"{summary['task']}, {summary['mode']} {summary['loss']}, {summary['searchers']} searcher(s), "
            f"{summary['wall_seconds']:.0f} s",
        ),
        (
            "held-out greedy accuracy",
            f"{_pct(summary.get('accuracy_start'))} → {_pct(summary.get('accuracy_end'))}"
            + (f" (best {best['accuracy']:.1%} at v{best['version']})" if best else ""),
        ),
        ("time to accuracy", ", ".join(reached) or "no target reached"),
        ("targets not reached", ", ".join(missed) or "none"),
        (
            "trainer steps",
            f"{_count(summary.get('trainer_steps'))}, {len(versions)} versions published"
            + (f" (last v{versions[-1]})" if versions else ""),
        ),
        ("samples generated", _count(samples_generated(timeline))),
        *((name, account_line(a)) for name, a in (summary.get("searcher_accounts") or {}).items()),
        (
            "samples ingested / stored",
            f"{_count(ingested)} / {_count(b.get('samples'))} in {_count(b.get('prompts'))} prompts",
        ),
        ("duplicates", f"{_count(duplicates)}{dup}"),
        ("distinct samples trained on", trained_line(b)),
        ("evicted / dead-lettered", f"{_count(b.get('samples_evicted'))} / {_count(b.get('samples_dead_lettered'))}"),
        (
            "staleness of trained samples",
            "-"
            if stale.get("mean") is None
            else f"mean {stale['mean']:.1f}, p95 {stale['p95']}, max {stale['max']} versions",
        ),
        *((f"time: {name}", time_line(split)) for name, split in (summary.get("time_split") or {}).items()),
        (
            "CPU busy",
            ", ".join(f"{cpu} {f:.0%}" for cpu, f in sorted((summary.get("cpu_busy") or {}).items())) or "-",
        ),
        ("restarts", restarts),
        ("events", f"{len(summary.get('events') or [])} (listed below)" if summary.get("events") else "none"),
    ]
    return [(k, v if len(v) <= MAX_CELL else v[: MAX_CELL - 1] + "…") for k, v in rows]


# --- plots ------------------------------------------------------------------------------------------------


def smooth(values: list[float], window: int) -> np.ndarray:
    """Centred moving average over ``window`` points (shorter at the ends), NaN-free input."""
    v = np.asarray(values, dtype=float)
    if window <= 1 or v.size == 0:
        return v
    kernel = np.ones(window)
    sums = np.convolve(v, kernel, mode="same")
    counts = np.convolve(np.ones_like(v), kernel, mode="same")
    return sums / counts


def _window(n: int) -> int:
    return max(1, n // 40)


def _raw_and_smooth(ax, xs: list[float], ys: list[float], label: str, color: str) -> None:
    """A series as a person reads it: raw points faint, a smoothed line on top."""
    if not xs:
        return
    ax.plot(xs, ys, color=color, alpha=0.2, linewidth=0.8)
    ax.plot(xs, smooth(ys, _window(len(ys))), color=color, linewidth=2, label=label)


def rate_series(times: list[float], counts: list[float], window_s: float) -> tuple[list[float], list[float]]:
    """Events per second over the trailing ``window_s`` seconds at each time, from a cumulative count."""
    out_t, out_r = [], []
    j = 0
    for t, c in zip(times, counts, strict=True):
        while times[j] < t - window_s:
            j += 1
        if t > times[j]:
            out_t.append(t)
            out_r.append(max(0.0, (c - counts[j]) / (t - times[j])))
    return out_t, out_r


def staleness_over_steps(steps: list[dict[str, Any]], bins: int = 40) -> dict[str, list[float]]:
    """Median, p95 and mean staleness of the trained samples per window of steps."""
    out: dict[str, list[float]] = {"step": [], "p50": [], "p95": [], "mean": []}
    with_hist = [s for s in steps if s.get("staleness_hist")]
    if not with_hist:
        return out
    size = max(1, len(with_hist) // bins)
    for i in range(0, len(with_hist), size):
        chunk = with_hist[i : i + size]
        counts = staleness_counts(chunk)
        p50, p95, average = quantile(counts, 0.5), quantile(counts, 0.95), mean(counts)
        assert p50 is not None and p95 is not None and average is not None  # every step in chunk has a histogram
        out["step"].append(chunk[len(chunk) // 2]["step"])
        out["p50"].append(p50)
        out["p95"].append(p95)
        out["mean"].append(average)
    return out


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

    fig, axes = plt.subplots(1, 2, figsize=(12, 3.8))
    rewarded = [s for s in steps if s.get("reward_mean") is not None]
    _raw_and_smooth(axes[0], [s["t"] for s in rewarded], [s["reward_mean"] for s in rewarded], "batch reward", "C0")
    _raw_and_smooth(axes[1], [s["step"] for s in rewarded], [s["reward_mean"] for s in rewarded], "batch reward", "C0")
    if evals:
        axes[0].plot(
            [e["t"] for e in evals], [e["accuracy"] for e in evals], "o-", color="C3", label="held-out greedy accuracy"
        )
        axes[1].plot(
            [e["version"] for e in evals],
            [e["accuracy"] for e in evals],
            "o-",
            color="C3",
            label="held-out greedy accuracy",
        )
    axes[0].set_xlabel("seconds since the start")
    axes[1].set_xlabel("trainer step (= policy version)")
    for ax in axes:
        ax.set_ylim(0, 1.02)
        ax.grid(alpha=0.3)
        ax.legend(loc="lower right")
    figs["Held-out accuracy and batch reward"] = _png(fig)
    plt.close(fig)

    fig, axes = plt.subplots(1, 2, figsize=(12, 3.8))
    st = staleness_over_steps(steps)
    if st["step"]:
        axes[0].fill_between(st["step"], 0, st["p95"], color="C1", alpha=0.2, label="0 to p95")
        axes[0].plot(st["step"], st["p50"], color="C1", linewidth=2, label="median")
        axes[0].plot(st["step"], st["mean"], color="C1", linestyle="--", label="mean")
        axes[0].set_ylim(0, max(1.0, 1.1 * max(st["p95"])))
        axes[0].legend(loc="upper left")
    axes[0].set_xlabel("trainer step")
    axes[0].set_ylabel("versions behind the policy")
    axes[0].set_title("staleness of trained samples")
    sized = [(r["t"], (r.get("buffer") or {}).get("samples")) for r in timeline]
    sized = [(t, n) for t, n in sized if n is not None]  # a missed poll is a gap, not an empty buffer
    axes[1].plot([t for t, _ in sized], [n for _, n in sized], color="C2")
    axes[1].set_xlabel("seconds since the start")
    axes[1].set_title("samples stored in the buffer")
    for ax in axes:
        ax.grid(alpha=0.3)
    figs["Staleness and buffer"] = _png(fig)
    plt.close(fig)

    # Two panels: training consumes samples far faster than one searcher makes them on small models,
    # and on one axis the searchers' lines would lie flat along the bottom.
    fig, (train_ax, gen_ax) = plt.subplots(1, 2, figsize=(12, 3.8))
    if steps:
        done = np.cumsum([s.get("samples", 0) for s in steps]).tolist()
        _raw_and_smooth(train_ax, *rate_series([s["t"] for s in steps], done, 10.0), "trainer", "C0")
    train_ax.set_title("trained on (samples/s, 10 s window)")
    counts = [(r["t"], (r.get("buffer") or {}).get("samples_ingested")) for r in timeline]
    ingested = [(t, float(n)) for t, n in counts if isinstance(n, int)]
    if ingested:
        _raw_and_smooth(
            gen_ax, *rate_series([t for t, _ in ingested], [n for _, n in ingested], 10.0), "buffer (ingested)", "C2"
        )
    names = sorted({n for r in timeline for n in (r.get("searchers") or {})})
    for i, name in enumerate(names):
        points = [
            (r["t"], r["searchers"][name].get("samples_per_s")) for r in timeline if name in (r.get("searchers") or {})
        ]
        rates = [(t, float(v)) for t, v in points if isinstance(v, int | float)]
        _raw_and_smooth(gen_ax, [t for t, _ in rates], [v for _, v in rates], name, f"C{4 + i % 6}")
    gen_ax.set_title("generated and ingested (samples/s)")
    for ax in (train_ax, gen_ax):
        ax.set_xlabel("seconds since the start")
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(loc="lower right")
    figs["Throughput per service"] = _png(fig)
    plt.close(fig)
    return figs


STYLE = (
    "body{font-family:sans-serif;margin:2em;max-width:1150px;color:#222}"
    "table{border-collapse:collapse;margin-bottom:1.5em}td,th{padding:3px 10px;text-align:left;"
    "border-bottom:1px solid #ddd;font-size:14px;vertical-align:top}th{font-weight:600;white-space:nowrap}"
    "img{max-width:100%}li{font-size:13px;font-family:monospace}"
)


def write_report(run_dir: Path, summary: dict[str, Any], t0: float) -> Path:
    timeline = read_jsonl(run_dir / "timeline.jsonl")
    rows = "".join(
        f"<tr><th>{html.escape(k)}</th><td>{html.escape(v)}</td></tr>" for k, v in summary_rows(summary, timeline)
    )
    events = summary.get("events") or []
    event_list = (
        ("<h2>Events</h2><ul>" + "".join(f"<li>{html.escape(e[:300])}</li>" for e in events[-50:]) + "</ul>")
        if events
        else ""
    )
    imgs = "".join(
        f"<h2>{html.escape(t)}</h2><img alt='{html.escape(t)}' src='data:image/png;base64,{b}'>"
        for t, b in _plots(run_dir, summary["evaluations"], t0).items()
    )
    page = (
        f"<!doctype html><meta charset='utf-8'><title>TBA run report</title><style>{STYLE}</style>"
        f"<h1>TBA run: {html.escape(summary['task'])}, {html.escape(summary['mode'])} "
        f"{html.escape(summary['loss'])}</h1><table id='summary'>{rows}</table>{imgs}{event_list}"
        "<p>Every figure, with the full lists of versions, is in summary.json beside this file.</p>"
    )
    out = run_dir / "report.html"
    out.write_text(page)
    return out
