"""The pages of claims (2) and (3), the multi-turn environment, `make demo`'s runs and the single runs on shared
cores, each from its records."""

from __future__ import annotations

import statistics
from typing import Any

from experiments.records import summarize
from experiments.report import md

Record = dict[str, Any]


def header(title: str, intro: list[str]) -> list[str]:
    return [f"# {title}", "", md.BANNER, "", *intro]


def code(record: Record) -> str:
    """The code a record measured: its commit, or where its figures were first recorded."""
    return f"commit `{record['commit']}`" if record.get("commit") else f"recorded in `{record.get('recorded_in')}`"


def provenance(name: str, experiment: str, record: Record) -> str:
    """Where and when a record was measured, and its data file. Records carry no settings that differ from the
    defaults of their code; this says whose defaults those were."""
    machine = record.get("machine") or {}
    return (
        f"CPU: {md.cpu(machine)}, {machine.get('cores', '?')} cores; {md.date(record)}; {code(record)}; data "
        f"{md.data_link(experiment, name)}. Measured with the defaults of that code."
    )


def runs_spread(runs: list[dict[str, Any]], *path: str) -> dict[str, Any]:
    """The spread over runs of the figure at ``path`` (``"end", "distinct_correct"``)."""

    def get(run: dict[str, Any]) -> Any:
        for key in path:
            run = run[key]
        return run

    return summarize([get(r) for r in runs])


# --- claim (2): diversity -----------------------------------------------------------------------------------------


def diversity(records: list[tuple[str, Record]]) -> str:
    lines = header(
        "Claim (2): off-policy sampling keeps more distinct correct answers",
        [
            "Task `sums`: write n as a + b, so each prompt has n // 2 correct answers. Asynchronous TB against "
            "exactly on-policy GRPO, from the same SFT base, search on CPU 0 and training on CPU 1.",
            "",
            "The measure: 16 samples per held-out prompt at temperature 0.7. Distinct correct answers per prompt, "
            "and the sampled accuracy, at the end and at *matched accuracy*: each run's first checkpoint at the "
            "highest greedy accuracy every run reached.",
            "",
        ],
    )
    for i, (name, record) in enumerate(reversed(records)):
        seeds = max(len(a["runs"]) for a in record["arms"].values())
        lines += ["## Latest result" if i == 0 else f"## Earlier: {seeds} seed(s)", ""]
        lines += [provenance(name, "diversity", record), ""]
        body = []
        for arm_name, arm in record["arms"].items():
            runs = arm["runs"]
            body.append(
                [
                    arm_name,
                    md.spread(runs_spread(runs, "end", "distinct_correct"), "{:.2f}"),
                    md.spread(runs_spread(runs, "end", "sampled_accuracy"), "{:.1f}", 100, "%"),
                    md.spread(runs_spread(runs, "end", "greedy_accuracy"), "{:.1f}", 100, "%"),
                    md.spread(runs_spread(runs, "matched", "distinct_correct"), "{:.2f}"),
                    md.spread(runs_spread(runs, "matched", "sampled_accuracy"), "{:.1f}", 100, "%"),
                    " / ".join(
                        md.num(distinct_per_correct(runs, when, record["samples"])) for when in ("matched", "end")
                    ),
                    md.spread(runs_spread(runs, "trainer_steps")),
                ]
            )
        lines += md.table(
            [
                "arm",
                "distinct correct / prompt, end",
                "sampled accuracy, end",
                "greedy accuracy, end",
                f"distinct correct / prompt, matched ({md.pct(record['matched_accuracy'])} greedy)",
                "sampled accuracy, matched",
                "distinct per correct sample, matched / end",
                "trainer steps",
            ],
            body,
        )
        lines += ["", f"Reproduce: `{record['command']}`, then `python -m experiments.report`.", ""]
    return "\n".join(lines)


def distinct_per_correct(runs: list[dict[str, Any]], when: str, samples: int) -> float:
    """Distinct correct answers per correct sample (ratio of the means): how spread out the correct answers are,
    apart from how often an arm is right."""
    distinct = statistics.mean(r[when]["distinct_correct"] for r in runs)
    return distinct / (statistics.mean(r[when]["sampled_accuracy"] for r in runs) * samples)


# --- claim (3): search on a sparse reward -------------------------------------------------------------------------


def redteam(records: list[tuple[str, Record]]) -> str:
    name, record = records[-1]
    lines = header(
        "Claim (3): more search finds more, and more distinct, successes on a sparse reward",
        [
            "A red-teaming-style task: the arithmetic model is rewarded by a judge the project trains (a character "
            "CNN that flags completions holding `77`). TB with a constant β = 0.05 and a global buffer cap of "
            "20,000 samples. The trainer's budget is fixed: CPU 1, a checkpoint every 32 steps. The search budget "
            "varies: the batches the searcher (CPU 0) may generate per policy version.",
            "",
            "## Latest result",
            "",
            provenance(name, "redteam", record),
            "",
            f"The base model: {md.pct(record['base']['sampled_success'], 2)} of its samples succeed, "
            f"{md.pct(record['base']['greedy_success'])} greedy.",
            "",
        ],
    )
    body = []
    for arm in record["arms"].values():
        runs, summary = arm["runs"], arm.get("summary") or {}
        body.append(
            [
                f"{arm['batches_per_version']} / version",
                md.spread(runs_spread(runs, "generated"), "{:,.0f}"),
                md.spread(runs_spread(runs, "successes"), "{:,.0f}"),
                md.spread(runs_spread(runs, "distinct")),
                md.spread(runs_spread(runs, "sampled_success"), "{:.1f}", 100, "%"),
                md.spread(runs_spread(runs, "greedy_success"), "{:.1f}", 100, "%"),
                md.spread(summary.get("distinct_final"), "{:.2f}"),
                md.spread(summary.get("time_to_target")),
            ]
        )
    lines += md.table(
        [
            "search budget (batches)",
            "samples generated",
            "successes found",
            "distinct successes",
            "policy success, sampled",
            "policy success, greedy",
            "distinct successes / prompt, 16 samples",
            f"time to {md.target(record['target'])} greedy (s)",
        ],
        body,
    )
    lines += ["", f"Reproduce: `{record['command']}`, then `python -m experiments.report`.", ""]
    return "\n".join(lines)


# --- multi-turn: the calculator environment ----------------------------------------------------------------------


def environments(records: list[tuple[str, Record]]) -> str:
    name, record = records[-1]
    s = record["summary"]
    lines = header(
        "Multi-turn: the calculator environment learned with TB",
        [
            "The shipped calculator task: the model calls a calculator, the calculator's answer is environment "
            "context (never trained on), then the model answers. `tba up --task calculator`: 2 searchers and the "
            "trainer sharing the cores, from the task's SFT base, held-out greedy accuracy every "
            f"{record['evaluation']['every_s']:g} s on {record['evaluation']['prompts']} prompts.",
            "",
            "## Latest result",
            "",
            provenance(name, "environments", record),
            "",
        ],
    )
    lines += md.table(
        [
            "seeds",
            "start",
            "lowest",
            "end",
            *(f"time to {md.target(t)} (s)" for t in record["targets"]),
            "trainer steps",
        ]
        + ["model turns / trajectory", "environment tokens / trajectory", "failed episodes"],
        [
            [
                s["accuracy_end"]["of"],
                md.spread(s["accuracy_start"], "{:.1f}", 100, "%"),
                md.spread(s["accuracy_lowest"], "{:.1f}", 100, "%"),
                md.spread(s["accuracy_end"], "{:.1f}", 100, "%"),
                *(md.spread(s["time_to"][str(t)]) for t in record["targets"]),
                md.spread(s["trainer_steps"]),
                md.spread(s["turns"], "{:.2f}"),
                md.spread(s["env_tokens"], "{:.2f}"),
                md.spread(s["failed"]),
            ]
        ],
    )
    lines += ["", f"Reproduce: `{record['command']}`, then `python -m experiments.report`.", ""]
    return "\n".join(lines)


# --- make demo ---------------------------------------------------------------------------------------------------


def current_demo_runs(record: Record) -> list[dict[str, Any]]:
    return [r for r in record["runs"] if r["deviations"] == {}]


def demo(records: list[tuple[str, Record]]) -> str:
    name, record = records[-1]
    current = current_demo_runs(record)
    lines = header(
        "`make demo`: ten minutes of the whole system on two cores",
        [
            "`make demo` runs `tba up` for 10 minutes: a searcher on CPU 0, the trainer and a backfill searcher at "
            "the lowest priority on CPU 1. Held-out greedy accuracy every 30 s on 200 prompts; times from launch, "
            "the engines' start included. The demo's targets: 50% within 2 minutes, 90% or more at the end.",
            "",
            f"Data: {md.data_link('demo', name)}.",
            "",
        ],
    )
    if current:
        ends = [r["accuracy"]["end"] for r in current]
        t50 = [r["time_to"]["0.5"] for r in current if r["time_to"]["0.5"] is not None]
        latest = current[-1]
        lines += [
            "## Current result",
            "",
            f"The latest run at the current defaults: `{latest['command']}`, {md.cpu(latest['machine'])}: "
            f"{md.pct(latest['accuracy']['start'])} → **{md.pct(latest['accuracy']['end'])}**, 50% at "
            f"**{md.seconds(latest['time_to']['0.5'])}**, {latest['trainer_steps']:,} trainer steps.",
            "",
            f"Over the {len(current)} runs at the current defaults: {md.pct(min(ends))}-{md.pct(max(ends))} at the "
            f"end (mean {md.pct(statistics.mean(ends))}), 50% at {min(t50):.0f}-{max(t50):.0f} s.",
            "",
        ]
    body = [
        [
            md.date(r),
            md.cpu(r["machine"]),
            f"`{r['command']}`",
            md.settings(r["deviations"]),
            code(r),
            md.pct(r["accuracy"]["start"]),
            md.pct(r["accuracy"]["end"]),
            md.seconds(r["time_to"]["0.5"]),
            md.seconds(r["time_to"]["0.9"]),
            f"{r['trainer_steps']:,}",
            r.get("note", ""),
        ]
        for r in reversed(record["runs"])
    ]
    lines += ["## Every run", ""]
    lines += md.table(
        ["date", "CPU", "command", "settings that differ", "code", "start", "end", "50% at", "90% at", "steps", "note"],
        body,
    )
    return "\n".join([*lines, ""])


# --- single runs on shared cores ---------------------------------------------------------------------------------


def single_runs(name: str, record: Record, plot: str | None) -> str:
    targets = record["targets"]
    lines = header(
        f"Single runs on shared cores: {record['task']}, {record['minutes']:g} minutes",
        [
            record["description"] + " One run per arm; the bare single-process loop is experiments/plain_loop.py.",
            "",
            provenance(name, "single-runs", record),
            "",
        ],
    )
    body = []
    for arm_name, arm in record["arms"].items():
        acc = arm["accuracy"]
        body.append(
            [
                arm_name,
                f"{arm['trainer_steps']:,}",
                md.pct(acc["start"]),
                md.pct(acc["peak"]),
                md.pct(acc["last_5_mean"]),
                md.pct(acc["end"]),
                *(md.seconds(arm["time_to"][str(t)]) for t in targets),
            ]
        )
    lines += md.table(
        ["arm", "steps", "start", "peak", "mean of the last 5", "end", *(f"{md.target(t)} at" for t in targets)],
        body,
    )
    if plot:
        lines += ["", f"![held-out accuracy against time]({plot})"]
    lines += ["", f"Command: `{record['command']}`.", ""]
    return "\n".join(lines)
