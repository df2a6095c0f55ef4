"""The one ablation table: every lever tried beside the experiments, measured against the same experiment's run
without it. Rows come from the levers the decoupling records name and from the pilots' record
(docs/results/data/ablations/pilots.json)."""

from __future__ import annotations

from typing import Any

from experiments.report import md

ORDER = {"not adopted": 0, "superseded": 1, "adopted": 2}


def versus(row: dict[str, Any]) -> str:
    """Times to the targets with the lever over those without it, per target (below 1: sooner with it)."""
    parts = []
    for t, mine in row["with"]["time_to"].items():
        theirs = row["without"]["time_to"].get(t)
        if mine is None and theirs is None:
            continue
        if mine is None or theirs is None:
            parts.append(f"{md.target(t)}: {'not reached' if mine is None else 'only with'}")
        else:
            parts.append(f"{md.target(t)}: {mine / theirs:.2f}")
    return ", ".join(parts) or "-"


def page(rows: list[dict[str, Any]]) -> str:
    rows = sorted(rows, key=lambda r: (ORDER[r["outcome"]], r["date"]))
    header = ["lever", "mode", "task, budget", "seeds", "CPU", "time to target, with / without", "end, with / without"]
    header += ["outcome", "notes", "data"]
    body = []
    for r in rows:
        end = f"{md.pct(r['with']['end'])} / {md.pct(r['without']['end'])}" if r["with"]["end"] is not None else "-"
        times = versus(r)
        if r["times_from"] != "first step" and times != "-":
            times += " (from launch)"
        data = r.get("data")
        body.append(
            [
                r["lever"],
                r["mode"],
                r["task"] + (f", {r['minutes']:g} min" if r.get("minutes") else ""),
                r["seeds"],
                md.cpu(r["machine"]),
                times,
                end,
                r["outcome"],
                r.get("other") or "",
                md.data_link(*data) if data else f"[pilots](data/ablations/pilots.json), {r['recorded_in']}",
            ]
        )
    lines = [
        "# Levers tried: the ablation table",
        "",
        md.BANNER,
        "",
        "Each row is one change, measured beside the same experiment's run without it. The time column divides the "
        "time to each target with the change by the time without it: below 1 is sooner. Times run from the "
        "trainer's first step unless marked. Seeds are those both runs share.",
        "",
        "Outcome: *adopted* is in today's defaults; *superseded* was adopted, then replaced; *not adopted* was "
        "left out.",
        "",
        *md.table(header, body),
        "",
    ]
    return "\n".join(lines)
