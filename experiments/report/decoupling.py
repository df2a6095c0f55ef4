"""Claim (1)'s pages from the decoupling records: the current result, every record with the current defaults, the
records with earlier defaults, and the command that reproduces them.

A record is *at the current defaults* when both arms of its first pair (the asynchronous system and the
exactly on-policy loop) differ from today's defaults in no setting (``deviations`` empty). Code changes that
no setting names (how checkpoints are fsynced, say) are listed per record as ``code_differences``.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from typing import Any

from experiments.report import md, plots

Record = dict[str, Any]
PAGES = {"arithmetic": "decoupling.md", "calculator": "decoupling-calculator.md"}
TITLES = {
    "arithmetic": "Claim (1): decoupling search from training, two-digit addition",
    "calculator": "Claim (1) where generation dominates: decoupling on the calculator task",
}
COMMANDS = {
    "arithmetic": "python -m experiments.decoupling --seeds 3 --minutes 5 10",
    "calculator": "python -m experiments.decoupling --seeds 3 --minutes 5 --generation-heavy",
}
# The targets of each task's tables, and those whose async / sync ratio is the claim's figure (<= 0.5: twice as fast).
TARGETS = {"arithmetic": (0.5, 0.6, 0.7, 0.8), "calculator": (0.4, 0.5, 0.6)}
HEADLINE = {"arithmetic": ("0.5", "0.6", "0.7"), "calculator": ("0.4", "0.5")}


def main_pair(record: Record) -> dict[str, Any]:
    return record["pairs"][0]


def is_current(record: Record) -> bool:
    pair = main_pair(record)
    return all(record["arms"][pair[side]]["deviations"] == {} for side in ("async", "sync"))


def seeds(record: Record) -> int:
    counts = [len(a["runs"]) for a in record["arms"].values() if a["runs"]]
    if counts:
        return max(counts)
    return max(a["summary"]["time_to"][next(iter(a["summary"]["time_to"]))]["of"] for a in record["arms"].values())


def sync_cycle(record: Record) -> str:
    """The range of the synchronous runs' median cycles (s): the speed of the machine for this loop."""
    pair = main_pair(record)
    cycles = [
        (r.get("sync_cycle") or {}).get("cycle") or (r.get("step") or {}).get("cycle")
        for r in record["arms"][pair["sync"]]["runs"]
    ]
    have = [c for c in cycles if c]
    if not have:
        return "-"
    low, high = min(have), max(have)
    return f"{low:.2f}" if f"{low:.2f}" == f"{high:.2f}" else f"{low:.2f}-{high:.2f}"


def ratios(record: Record, key: str = "time_ratio", pair: dict[str, Any] | None = None) -> dict[str, Any]:
    return (pair or main_pair(record)).get(key) or {}


def deviations(record: Record) -> str:
    """The settings the record's pair differs in, the asynchronous arm's own marked as such."""
    pair = main_pair(record)
    a, s = (record["arms"][pair[side]]["deviations"] for side in ("async", "sync"))
    shared = {k: v for k, v in a.items() if s.get(k) == v}
    only_a = {k: v for k, v in a.items() if k not in shared}
    only_s = {k: v for k, v in s.items() if k not in shared}
    parts = [md.settings(shared)] if shared else []
    if only_a:
        parts.append("async " + md.settings(only_a))
    if only_s:
        parts.append("sync " + md.settings(only_s))
    evaluation = record.get("evaluation") or {}
    if evaluation and not evaluation.get("after_run"):
        parts.append(f"evaluated every {evaluation['every_s']:g} s during the run")
    return "; ".join(parts) or "defaults"


def latest_current(records: list[tuple[str, Record]], task: str) -> dict[float, tuple[str, Record]]:
    """The newest record at the current defaults for each budget: the claim's current result."""
    out: dict[float, tuple[str, Record]] = {}
    for name, record in records:
        if record["task"] == task and is_current(record):
            out[record["minutes"]] = (name, record)  # records come oldest first
    return dict(sorted(out.items()))


def current_range(records: list[tuple[str, Record]], task: str) -> dict[str, list[float]]:
    """The lowest and highest async / sync ratio at each headline target over every record at the current defaults."""
    found: dict[str, list[float]] = {t: [] for t in HEADLINE[task]}
    for _, record in records:
        if record["task"] == task and is_current(record):
            for t in HEADLINE[task]:
                r = ratios(record).get(t)
                if r:
                    found[t].append(r["mean"])
    return {t: [min(v), max(v)] for t, v in found.items() if v}


def arm_rows(record: Record) -> list[list[str]]:
    pair = main_pair(record)
    rows = []
    for side, label in (("async", "async TB, bounded (the defaults)"), ("sync", "sync TB, exactly on-policy")):
        arm = record["arms"][pair[side]]
        summary = arm.get("summary") or {}
        cells = [label, f"{record['minutes']:g} min"]
        cells += [md.spread(summary.get("time_to", {}).get(str(t))) for t in TARGETS[record["task"]]]
        cells.append(md.spread(summary.get("accuracy_end"), "{:.1f}", 100, "%"))
        cells.append(md.spread(summary.get("trainer_steps")))
        rows.append(cells)
    return rows


def record_rows(records: list[tuple[str, Record]], task: str, current: bool) -> list[list[str]]:
    rows = []
    targets = TARGETS[task]
    for name, record in reversed(records):
        if record["task"] != task or is_current(record) != current:
            continue
        r = ratios(record)
        coarse = ratios(record, "coarse_time_ratio")
        cells = [md.date(record), md.cpu(record["machine"]), f"{record['minutes']:g} min", seeds(record)]
        cells.append(sync_cycle(record))
        if not current:
            cells.append(deviations(record))
        cells += [md.ratio(r.get(str(t)), bold_at=0.5 if str(t) in HEADLINE[task] else None) for t in targets]
        cells.append(" / ".join(md.num((coarse.get(t) or {}).get("mean")) for t in HEADLINE[task]) if coarse else "-")
        if current:
            cells.append("; ".join(record.get("code_differences") or []) or "-")
        cells.append(md.data_link("decoupling", name))
        rows.append(cells)
    return rows


def page(records: list[tuple[str, Record]], task: str) -> str:
    """The claim's page for ``task``: every decoupling record of it, newest first within each table."""
    records = [(n, r) for n, r in records if r["task"] == task]
    targets = TARGETS[task]
    headline = HEADLINE[task]
    lines = [f"# {TITLES[task]}", "", md.BANNER, ""]
    lines += [
        "Search on CPU 0 and training on CPU 1 in both arms, as on separate GPUs. Both arms train with the TB "
        "loss from the same SFT base, for the same wall-clock budget. The asynchronous arm is the system with its "
        "defaults. The synchronous arm is exactly on-policy: one batch per policy version, a checkpoint every step.",
        "",
        "The figure is the time from the trainer's first step to a held-out greedy accuracy, asynchronous over "
        "synchronous: the ratio of the seeds' mean times, with the range of the per-seed ratios. "
        f"At or below 0.5 (bold) at {', '.join(md.target(t) for t in headline)}, decoupling halves the time.",
        "",
    ]
    current = latest_current(records, task)
    if current:
        lines += ["## Current result", ""]
    else:  # nothing measured with today's defaults: the newest record of each budget, with what differs
        current = {r["minutes"]: (n, r) for n, r in records}
        lines += ["## Latest result", "", "No record at the current defaults yet. The newest records differ in:", ""]
        lines += [f"- {m:g} minutes: {deviations(r)}." for m, (_, r) in sorted(current.items())] + [""]
    for _, (name, record) in sorted(current.items()):
        lines.append(
            f"- {record['minutes']:g} minutes: {md.cpu(record['machine'])}, {record['machine']['cores']} cores, "
            f"{seeds(record)} seeds, {md.date(record)}; data {md.data_link('decoupling', name)}."
        )
    if current:
        header = ["arm", "budget", *(f"time to {md.target(t)} (s)" for t in targets), "accuracy at the end", "steps"]
        rows = [row for _, (_, record) in current.items() for row in arm_rows(record)]
        lines += ["", *md.table(header, rows), ""]
        header = ["budget", *(f"async / sync at {md.target(t)}" for t in targets)]
        rows = [
            [f"{record['minutes']:g} min", *(md.ratio(ratios(record).get(str(t)), 0.5) for t in targets)]
            for _, (_, record) in current.items()
        ]
        lines += md.table(header, rows) + [""]
        for _, (_, record) in current.items():
            if plot := plots.decoupling_plot(record):
                lines += [f"![held-out accuracy against time, {record['minutes']:g} minutes]({plot})", ""]
    spans = current_range(records, task)
    if spans:
        count = sum(1 for _, r in records if is_current(r))
        lines += [
            f"Over all {count} records at the current defaults, async / sync is "
            + ", ".join(f"{lo:.2f}-{hi:.2f} at {md.target(t)}" for t, (lo, hi) in spans.items())
            + ".",
            "",
        ]
    grid = f"{(records[-1][1].get('evaluation') or {}).get('coarse_every_s', 15):g}-s grid" if records else "grid"
    lines += ["## Every record at the current defaults", ""]
    header = ["date", "CPU", "budget", "seeds", "sync cycle (s)", *(md.target(t) for t in targets)]
    header += [f"{grid} {' / '.join(md.target(t) for t in headline)}", "code differences", "data"]
    rows = record_rows(records, task, current=True)
    lines += (md.table(header, rows) if rows else ["None yet."]) + [""]
    lines += ["## Records with earlier defaults", ""]
    header = ["date", "CPU", "budget", "seeds", "sync cycle (s)", "settings that differ from today's"]
    header += [*(md.target(t) for t in targets), f"{grid} {' / '.join(md.target(t) for t in headline)}", "data"]
    lines += md.table(header, record_rows(records, task, current=False)) + [""]
    lines += [
        "## Reproduce",
        "",
        f"`{COMMANDS[task]}`, then `python -m experiments.report`. Each budget writes one record to "
        "docs/results/data/decoupling/. Runs go to runs/experiments/decoupling/; a finished run is not run again.",
        "",
        "## How it is measured",
        "",
        "- Every 5 s the newest checkpoint is set aside; all are evaluated after the run on 200 held-out prompts, "
        "greedy.",
        f"- The {grid} keeps one evaluation in three: the same ratios, less sensitive to one lucky evaluation.",
        "- Times are counted from the trainer's first optimizer step. The start-up before it is the same in both arms.",
        "- The synchronous cycle is the median time per synchronous step: generate, score, reload, train, publish.",
        "- Older records name the settings they differ in. Their date is when the figures were recorded; "
        "`git show RECORDED_IN` shows the text they were converted from.",
        "- Levers tried beside these records: [ablations.md](ablations.md).",
        "",
    ]
    return "\n".join(lines)


def mean_over(runs: dict[int, dict[str, Any]], seeds: list[int], value: Callable[[dict[str, Any]], Any]) -> Any:
    """The mean of ``value`` over these seeds' runs; None where any of them has none (a target not reached)."""
    values = [value(runs[s]) for s in seeds]
    return statistics.mean(values) if values and None not in values else None


def lever_figures(runs: dict[int, dict[str, Any]], seeds: list[int], targets: tuple[str, ...]) -> dict[str, Any]:
    """Mean times to the targets and mean accuracy at the end of an arm's runs with these seeds."""
    times = {t: mean_over(runs, seeds, lambda r, t=t: r["time_to"][t]) for t in targets}
    return {"time_to": times, "end": mean_over(runs, seeds, lambda r: r["accuracy"]["end"])}


def lever_rows(records: list[tuple[str, Record]]) -> list[dict[str, Any]]:
    """The ablation rows of every lever a decoupling record measured: the lever's arm against the arm it changed,
    on the seeds both ran, times to the headline targets and the accuracy at the end."""
    by_name = dict(records)
    rows = []
    for name, record in records:
        for lever in record.get("levers", []):
            against = by_name[lever.get("against_record") or name]
            mine = {r["seed"]: r for r in record["arms"][lever["arm"]]["runs"]}
            theirs = {r["seed"]: r for r in against["arms"][lever["against"]]["runs"]}
            common = sorted(set(mine) & set(theirs))
            targets = HEADLINE[record["task"]]
            rows.append(
                {
                    "lever": lever["lever"],
                    "mode": record["arms"][lever["arm"]]["mode"],
                    "task": record["task"],
                    "minutes": record["minutes"],
                    "seeds": len(common),
                    "times_from": "first step",
                    "machine": record["machine"],
                    "with": lever_figures(mine, common, targets),
                    "without": lever_figures(theirs, common, targets),
                    "outcome": lever["outcome"],
                    "date": record["date"],
                    "data": ("decoupling", name),
                }
            )
    return rows
