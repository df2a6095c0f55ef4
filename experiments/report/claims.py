"""docs/results/claims.json and README's results table: one entry per claim, its current result from the records.

Each claim names the records it stands on and the figures that state it. Where the newest record of a claim
was measured with earlier defaults, its ``settings`` says so: a claim is restated only by measuring it again.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from experiments.report import decoupling, md, pages, real_model

Record = dict[str, Any]
Records = dict[str, list[tuple[str, Record]]]
MODEL = "the tiny character-level Llama (SFT base)"


def settings_of(record: Record, current: bool) -> str:
    if current:
        return "current defaults"
    return f"the code of {md.date(record)} (recorded in {record.get('recorded_in') or record.get('commit')})"


def entry(claim_id: str, claim: str, page: str, record: Record, names: list[str], **fields: Any) -> dict[str, Any]:
    machine = record.get("machine") or {}
    return {
        "id": claim_id,
        "claim": claim,
        "page": f"docs/results/{page}",
        "task": fields.pop("task", record.get("task")),
        "model": fields.pop("model", MODEL),
        "cpu_model": machine.get("cpu_model", "unknown"),
        "cpu_flags": machine.get("cpu_flags", []),
        "cores": machine.get("cores"),
        "commit": record.get("commit"),
        "recorded_in": record.get("recorded_in"),
        "date": md.date(record),
        "records": names,
        **fields,
    }


def rounded(r: dict[str, Any] | None) -> float | None:
    return None if r is None else round(r["mean"], 2)


def decoupling_claim(records: Records, task: str, claim_id: str, claim: str) -> dict[str, Any] | None:
    current = decoupling.latest_current(records["decoupling"], task)
    chosen = current or {}
    if not chosen:  # no record at today's defaults: the newest of each budget, named as such
        for name, record in records["decoupling"]:
            if record["task"] == task:
                chosen[record["minutes"]] = (name, record)
    if not chosen:
        return None
    targets = decoupling.HEADLINE[task]
    ratios = {
        f"{minutes:g}min": {t: rounded(decoupling.ratios(r).get(t)) for t in targets}
        for minutes, (_, r) in chosen.items()
    }
    newest = max((r for _, r in chosen.values()), key=lambda r: r["date"])
    seeds = min(decoupling.seeds(r) for _, r in chosen.values())
    summary = "; ".join(
        f"{' / '.join(md.num(v) for v in figs.values())} ({budget.replace('min', ' min')})"
        for budget, figs in ratios.items()
    )
    return entry(
        claim_id,
        claim,
        decoupling.PAGES[task],
        newest,
        [n for n, _ in chosen.values()],
        budget=" and ".join(f"{m:g} min" for m in chosen),
        seeds=seeds,
        settings=settings_of(newest, bool(current)),
        headline={
            "figure": f"async / sync time to {', '.join(md.target(t) for t in targets)} held-out accuracy",
            "ratios": ratios,
            "range_at_current_defaults": decoupling.current_range(records["decoupling"], task),
        },
        result=f"async / sync time to {' / '.join(md.target(t) for t in targets)}: {summary}",
    )


def diversity_claim(records: Records) -> dict[str, Any] | None:
    if not records["diversity"]:
        return None
    name, record = max(records["diversity"], key=lambda nr: max(len(a["runs"]) for a in nr[1]["arms"].values()))
    tb, grpo = record["arms"]["async-tb"]["runs"], record["arms"]["sync-grpo"]["runs"]

    def mean(runs: list[dict[str, Any]], when: str) -> float:
        return round(pages.runs_spread(runs, when, "distinct_correct")["mean"], 2)

    end, matched = (mean(tb, "end"), mean(grpo, "end")), (mean(tb, "matched"), mean(grpo, "matched"))
    return entry(
        "diversity",
        "(2) Off-policy sampling keeps more distinct correct answers",
        "diversity.md",
        record,
        [name],
        budget=f"{record['minutes']:g} min",
        seeds=len(tb),
        settings=settings_of(record, False),
        headline={
            "figure": "distinct correct answers per prompt (16 samples), async TB / sync GRPO",
            "end": list(end),
            "matched_accuracy": list(matched),
            "matched_at": record["matched_accuracy"],
        },
        result=f"distinct correct / prompt {end[0]:.2f} vs {end[1]:.2f} at the end, {matched[0]:.2f} vs "
        f"{matched[1]:.2f} at {md.pct(record['matched_accuracy'])} greedy",
    )


def redteam_claim(records: Records) -> dict[str, Any] | None:
    if not records["redteam"]:
        return None
    name, record = records["redteam"][-1]
    by_budget = {
        str(arm["batches_per_version"]): {
            "successes": round(pages.runs_spread(arm["runs"], "successes")["mean"]),
            "greedy_success": round(pages.runs_spread(arm["runs"], "greedy_success")["mean"], 3),
        }
        for arm in record["arms"].values()
    }
    arms = list(by_budget.values())
    return entry(
        "redteam",
        "(3) More search finds more successes on a sparse reward",
        "redteam.md",
        record,
        [name],
        budget=f"{record['minutes']:g} min",
        seeds=len(next(iter(record["arms"].values()))["runs"]),
        settings=settings_of(record, False),
        headline={"figure": "per search budget (batches per version): successes found, greedy success", **by_budget},
        result="successes "
        + " / ".join(f"{a['successes'] / 1000:.1f}k" for a in arms)
        + ", greedy success "
        + " / ".join(md.pct(a["greedy_success"], 0) for a in arms)
        + f" at {' / '.join(by_budget)} batches per version",
    )


def environments_claim(records: Records) -> dict[str, Any] | None:
    if not records["environments"]:
        return None
    name, record = records["environments"][-1]
    s = record["summary"]
    start, end = round(s["accuracy_start"]["mean"], 3), round(s["accuracy_end"]["mean"], 3)
    return entry(
        "environments",
        "A multi-turn tool environment is learned with TB",
        "environments.md",
        record,
        [name],
        budget=f"{record['minutes']:g} min",
        seeds=s["accuracy_end"]["of"],
        settings=settings_of(record, False),
        headline={"figure": "held-out greedy accuracy, start and end", "start": start, "end": end},
        result=f"{md.pct(start)} → {md.pct(end)} held-out accuracy",
    )


def demo_claim(records: Records) -> dict[str, Any] | None:
    if not records["demo"]:
        return None
    name, record = records["demo"][-1]
    current = pages.current_demo_runs(record)
    run = (current or record["runs"])[-1]
    ends = [r["accuracy"]["end"] for r in current]
    return entry(
        "demo",
        "`make demo`: the whole system for 10 minutes",
        "demo.md",
        run,
        [name],
        task="arithmetic",
        budget=f"{record['minutes']:g} min",
        seeds=1,
        settings=settings_of(run, bool(current)),
        headline={
            "figure": "held-out greedy accuracy start -> end, and the time to 50% (from launch)",
            "start": run["accuracy"]["start"],
            "end": run["accuracy"]["end"],
            "time_to_50_s": run["time_to"]["0.5"],
            "runs_at_current_defaults": len(current),
            "end_range_at_current_defaults": [min(ends), max(ends)] if ends else None,
        },
        result=f"{md.pct(run['accuracy']['start'])} → {md.pct(run['accuracy']['end'])}, 50% at "
        f"{md.seconds(run['time_to']['0.5'])}",
    )


CLAIMS: list[Callable[[Records], dict[str, Any] | None]] = [
    lambda r: decoupling_claim(r, "arithmetic", "decoupling", "(1) Decoupling search from training speeds training up"),
    lambda r: decoupling_claim(
        r, "calculator", "decoupling-generation-heavy", "(1) The same where generation dominates the cycle"
    ),
    diversity_claim,
    redteam_claim,
    environments_claim,
    lambda r: real_model.claim(r["real-model"], entry),
    demo_claim,
]


def claims(records: Records) -> list[dict[str, Any]]:
    return [c for make in CLAIMS if (c := make(records)) is not None]


def table(entries: list[dict[str, Any]], prefix: str) -> str:
    """The results table: one row per claim, each linking its page (``prefix``: the path from the table's file to
    docs/results/)."""
    rows = []
    for c in entries:
        page = c["page"].removeprefix("docs/results/")
        rows.append(
            [
                f"[{c['claim']}]({prefix}{page})",
                ("" if c["model"] == MODEL else f"{c['model']}, ")
                + f"{c['task']}, {c['budget']}, {c['seeds']} seed{'s' if c['seeds'] != 1 else ''}",
                c["result"],
                md.cpu(c),
                c["settings"],
            ]
        )
    return "\n".join(md.table(["claim", "setting", "result", "CPU", "code"], rows))
