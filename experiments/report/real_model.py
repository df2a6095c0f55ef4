"""The real-model page (docs/results/real-model.md) and its claim: SmolLM2-135M-Instruct learning through the
system against the exactly on-policy loop and TRL's GRPO, from the records of ``python -m experiments.real_model``.
"""

from __future__ import annotations

import json
from typing import Any

from experiments.records import ratio
from experiments.report import md
from experiments.report.pages import header
from tba.local.report import time_shares

Record = dict[str, Any]
PAGE = "real-model.md"
MODEL = "SmolLM2-135M-Instruct (pretrained)"
ARMS = {
    "async-tb-ahead": "TBA, asynchronous, the searcher a batch ahead of the trainer (the recipe)",
    "async-tb": "TBA, asynchronous, the searcher free",
    "async-tb-paced": "TBA, asynchronous, the searcher paced to a batch per version",
    "sync-tb": "TBA, exactly on-policy (sync)",
    "sync-tb-2-cores": "TBA, exactly on-policy, the trainer on both cores",
    "trl-grpo": "TRL GRPOTrainer",
}
ASYNC = ("async-tb-ahead", "async-tb", "async-tb-paced")
# The arms experiments.real_model runs unless --only names others.
DEFAULT_ARMS = ("async-tb-ahead", "trl-grpo", "sync-tb")
# The exactly on-policy arms as the targets name them; sync-tb is always judged, the others where a record holds them.
ON_POLICY = {"sync-tb": "on-policy", "sync-tb-2-cores": "on-policy (the trainer on both cores)"}


def judged(record: Record) -> str:
    """The arm the claim's targets judge: the recipe's (its searcher a batch ahead) where the record holds it, else
    the searcher free, the recipe of records that hold no other asynchronous arm."""
    return "async-tb-ahead" if "async-tb-ahead" in record["arms"] else "async-tb"


def _gains(record: Record) -> list[str]:
    return [f"+{g:g}" for g in record["gains"]]


def _points(gain: str) -> str:
    return f"+{round(float(gain) * 100)} points"


def _pair(record: Record, a: str, b: str) -> dict[str, Any] | None:
    return next((p for p in record["pairs"] if p["arms"] == [a, b]), None)


def _code(record: Record) -> str:
    commits = sorted({r.get("commit") or "?" for arm in record["arms"].values() for r in arm["runs"]})
    dirty = " (with uncommitted changes)" if record.get("dirty") else ""
    return ", ".join(f"`{c}`" for c in commits) + dirty


def experiment_records(records: list[tuple[str, Record]]) -> list[tuple[str, Record]]:
    """The experiment's own records (the folder also holds the raw model's prompt forms)."""
    return [(n, r) for n, r in records if r.get("experiment") == "real-model"]


def recipe_options() -> dict[str, Any]:
    """The recipe's task options: the real-model profile's, as they are now."""
    from experiments.peer import recipe

    return recipe("real-model")["task_options"]


def by_task(records: list[tuple[str, Record]]) -> list[tuple[str, Record]]:
    """The newest record of each task the experiment ran on each CPU and budget (times on one CPU do not compare
    with another's), the recipe's task first and, within a task, the record with the most runs first."""
    newest: dict[str, tuple[str, Record]] = {}
    for name, r in experiment_records(records):  # oldest first
        key = [_options(r), md.cpu(r.get("machine") or {}), r.get("minutes")]
        newest[json.dumps(key, sort_keys=True)] = (name, r)
    own = recipe_options()
    return sorted(newest.values(), key=lambda nr: (_options(nr[1]) != own, -_runs(nr[1])))


def _runs(record: Record) -> int:
    return sum(len(arm["runs"]) for arm in record["arms"].values())


def _options(record: Record) -> dict[str, Any]:
    return record.get("task_options") or {}


def page(records: list[tuple[str, Record]]) -> str:
    shown = by_task(records)
    lines = header(
        "A pretrained model learns through the system: SmolLM2-135M-Instruct",
        [
            "SmolLM2-135M-Instruct learns reasoning-gym tasks, asked in chat form and read by the lenient answer "
            "reader, with `tba up --profile real-model` (tba/local/profiles/real-model.toml, `make demo-real`). "
            "Three arms on the same 2 cores, the same held-out prompts and the same budget: the recipe as it is "
            "(asynchronous, its searcher kept one training batch ahead of the trainer's draws by "
            "`TBA_MAX_SAMPLES_AHEAD=64`), the same recipe exactly on-policy, and TRL's `GRPOTrainer` on the same "
            "model, prompts, answer reader and completion length (`python -m experiments.peer`, its configuration "
            "in experiments/peer.py). Where a record holds them: the recipe with its searcher free, as in the paper "
            "(`TBA_MAX_SAMPLES_AHEAD=off`), or paced to one batch per version (`TBA_MAX_BATCHES_PER_VERSION=1`), "
            "and the on-policy loop with the trainer on both cores (the searcher idles while it trains). The "
            "targets judge the recipe's arm, or the free searcher's where a record holds no recipe arm. One section "
            "per task and CPU: the recipe's own task first, then those run with `--task-options`.",
            "",
            "Held-out greedy accuracy; the TBA arms' checkpoints are evaluated after the run, the peer's clock stops "
            "while it evaluates. Times count from the first optimizer step; the targets are points over the raw "
            "model's accuracy.",
            "",
        ],
    )
    own = recipe_options()
    for name, record in shown:
        lines += _task_section(name, record, recipe=_options(record) == own)
    forms = [(n, r) for n, r in records if r.get("experiment") == "prompt-forms"]
    if forms:
        lines += _forms_section(forms)
    return "\n".join(lines)


def _task_section(name: str, record: Record, recipe: bool) -> list[str]:
    """One task's record: times to each target, their ratios, the runs, the claim's targets, the time split."""
    gains = _gains(record)
    machine = record.get("machine") or {}
    lines = [
        f"## {_task_label(_options(record))}"
        + (": the recipe's task" if recipe else "")
        + f", on {md.cpu(machine)}, {record['minutes']:g} minutes",
        "",
        f"Held-out greedy accuracy on {record['evaluation'].get('prompts') or '-'} prompts, every "
        f"{record['evaluation']['every_s']:g} s, {record['minutes']:g} minutes per run. CPU: {md.cpu(machine)}, "
        f"{machine.get('cores', '?')} cores; {md.date(record)}; code {_code(record)}; data "
        f"{md.data_link('real-model', name)}.",
        "",
        "### Time to each target",
        "",
    ]
    rows = []
    for arm, label in ARMS.items():
        a = record["arms"].get(arm)
        if a is None:
            continue
        s = a["summary"]
        rows.append(
            [
                label,
                s["accuracy_end"]["of"],
                md.spread(s["accuracy_start"], "{:.1f}", 100, "%"),
                *(md.spread(s["time_to"][g], unit=" s") for g in gains),
                md.spread(s["accuracy_end"], "{:.1f}", 100, "%"),
                md.spread(s["trainer_steps"]),
            ]
        )
    lines += md.table(["arm", "seeds", "raw model", *(f"time to {_points(g)}" for g in gains), "end", "steps"], rows)
    lines += ["", "### Ratios of the times, seed against seed", ""]
    ratio_rows = []
    for p in record["pairs"]:
        a, b = p["arms"]
        ratio_rows.append([f"{ARMS[a]} / {ARMS[b]}", len(p["seeds"]), *(md.ratio(p["time_ratio"][g]) for g in gains)])
    lines += md.table(["ratio", "seeds", *(_points(g) for g in gains)], ratio_rows)
    lines += [
        "",
        "Bold: at or below 0.5. In brackets: the range of the per-seed ratios; a seed that did not reach a target "
        "in one of the arms is left out of that target's ratio.",
        "",
        "### Runs",
        "",
    ]
    run_rows = []
    for arm, label in ARMS.items():
        for r in (record["arms"].get(arm) or {}).get("runs", []):
            run_rows.append(
                [
                    label,
                    r["seed"],
                    md.pct(r["accuracy"]["start"]),
                    md.pct(r["accuracy"]["lowest"]),
                    md.pct(r["accuracy"]["end"]),
                    *(md.seconds(r["time_to"][g]) for g in gains),
                    r.get("below_start"),
                    r.get("trainer_steps"),
                    _samples(r),
                ]
            )
    lines += md.table(
        [
            "arm",
            "seed",
            "start",
            "lowest",
            "end",
            *(_points(g) for g in gains),
            "evaluations below start",
            "steps",
            "samples generated / stored / trained",
        ],
        run_rows,
    )
    lines += ["", "### Against the claim's targets", ""]
    lines += md.table(["target", "measured", "seeds", "verdict"], targets(record))
    lines += ["", "### Where the time goes (asynchronous arms)", ""]
    lines += _time_table(record)
    rates = _rate_table(record)
    if rates:
        lines += ["", "### The trainer's compute by the batch's reward", "", *rates]
    return [*lines, "", f"Reproduce: {_reproduce(record)}, then `python -m experiments.report`.", ""]


def _reproduce(record: Record) -> str:
    """The command that ran the record's arms: the default arms and, named apart, any other; or, where the record
    lacks a default arm, its own arms named with ``--only``."""
    ran = list(record["arms"])
    if not set(DEFAULT_ARMS) <= set(ran):
        return f"`{record['command']} --only {','.join(ran)}`"
    named = [arm for arm in ran if arm not in DEFAULT_ARMS]
    extra = f"; {', '.join(named)}: the same with `--only {','.join(named)} --resume` on the record" if named else ""
    return f"`{record['command']}`{extra}"


def _forms_section(forms: list[tuple[str, Record]]) -> list[str]:
    """The raw model in each prompt form, for each task screened (the newest record of each task's options): why
    the recipe asks and reads as it does, and which candidate tasks leave room to climb."""
    newest: dict[str, tuple[str, Record]] = {}
    for name, r in forms:  # oldest first
        newest[json.dumps(r.get("task_options"), sort_keys=True)] = (name, r)
    shown = list(newest.values())
    last = shown[-1][1]
    lines = [
        "## The raw model in each prompt form",
        "",
        f"Held-out greedy accuracy and pass@1 / pass@k over k samples at the searchers' temperature "
        f"(T {last['temperature']:g}), up to {last['max_new_tokens']} new tokens, per task screened. The plain "
        "form is cut at the newline, as a searcher with that stop string cuts it. A task worth training on starts "
        "low with a high pass@k.",
        "",
    ]
    rows = [
        [
            _task_label(r.get("task_options") or {}),
            f["form"],
            md.pct(f["greedy"]),
            md.pct(f["pass_at_k"].get("1")),
            f"{md.pct(f['pass_at_k'].get(str(r['samples'])))} (k {r['samples']})",
            f.get("prompts", r["prompts"]),
            md.data_link("real-model", name),
        ]
        for name, r in shown
        for f in r["forms"]
    ]
    lines += md.table(["task", "form", "greedy", "pass@1", "pass@k", "prompts", "data"], rows)
    reproduce = f"Reproduce: each record's `command` (in its data; the newest: `{last['command']}`)"
    return [*lines, "", f"{reproduce}, then `python -m experiments.report`.", ""]


def _task_label(options: dict[str, Any]) -> str:
    """``chain_sum (min_terms 2, max_digits 2)``: the generator and its settings, without the reader (a form's)."""
    config = ", ".join(f"{k} {v}" for k, v in (options.get("config") or {}).items())
    return f"`{options.get('dataset', '?')}`" + (f" ({config})" if config else "")


def _verdict(met: bool | None, seeds: int, planned: int, bounded: bool = False) -> str:
    """'met' only once every planned seed is in; a partial record says how far it is. ``bounded``: measured, but
    only as a bound that decides nothing."""
    if met is None:
        return "not decided by the bound" if bounded else "not measured"
    if seeds < planned:
        return f"{'met' if met else 'not met'} so far ({seeds} of {planned} seeds)"
    return "**met**" if met else "not met"


def _unreached_bounds(record: Record, other: str, gain: str) -> list[float]:
    """Per seed where the recipe reached ``gain`` and ``other`` never did: the recipe's time over the other run's
    last evaluation, an upper bound on their ratio (the other arm would have needed longer than its whole run)."""
    by_seed = {r["seed"]: r for r in (record["arms"].get(other) or {}).get("runs", [])}
    out = []
    for mine in (record["arms"].get(judged(record)) or {}).get("runs", []):
        theirs = by_seed.get(mine["seed"])
        t = mine["time_to"].get(gain)
        if theirs is None or t is None or theirs["time_to"].get(gain) is not None or not theirs.get("evaluations"):
            continue
        out.append(t / max(theirs["evaluations"][-1][0], 1e-9))
    return out


def targets(record: Record) -> list[list[Any]]:
    """The claim's targets, each with what the record measured and whether it meets it: the recipe against TRL
    (time to the last target, accuracy at the end), against the exactly on-policy loop, its stability, and the
    balance of the two services (trainer busy; samples generated, stored and trained on)."""
    planned = int(record.get("seeds") or 0)
    last = _gains(record)[-1]
    mine_arm = judged(record)
    runs = (record["arms"].get(mine_arm) or {}).get("runs", [])
    rows: list[list[Any]] = []
    others = [
        ("trl-grpo", "TRL"),
        *((b, label) for b, label in ON_POLICY.items() if b == "sync-tb" or b in record["arms"]),
    ]
    for other, label in others:
        p = _pair(record, mine_arm, other)
        r = p and p["time_ratio"][last]
        bounds = _unreached_bounds(record, other, last)
        seeds = (r["n"] if r else 0) + len(bounds)
        ratio_ok = not r or (r["mean"] <= 0.5 and (other not in ON_POLICY or r["max"] < 1))
        undecided = ratio_ok and max(bounds, default=0.0) > 0.5  # a bound above 0.5 decides nothing
        met = None if not seeds or undecided else ratio_ok
        rule = f"time to {_points(last)}, async / {label} ≤ 0.5" + (", every seed < 1" * (other in ON_POLICY))
        measured = md.ratio(r, None)
        if bounds:
            measured = (measured + "; " if r else "") + (
                f"below {max(bounds):.2f} in {len(bounds)} seed{'s' * (len(bounds) > 1)} where {label} never reached "
                f"it (the recipe's time over {label}'s last evaluation)"
            )
        rows.append([rule, measured, seeds, _verdict(met, seeds, planned, bounded=undecided)])
        if other in ON_POLICY:
            rows += _step_floor(record, other, label)
    mine = (record["arms"].get(mine_arm) or {}).get("summary", {}).get("accuracy_end")
    peer = (record["arms"].get("trl-grpo") or {}).get("summary", {}).get("accuracy_end")
    if mine and peer and mine.get("n") and peer.get("n"):
        seeds = min(mine["n"], peer["n"])
        measured = f"{md.pct(mine['mean'])} against TRL's {md.pct(peer['mean'])}"
        rows.append(
            [
                "accuracy at the end ≥ TRL's + 10 points",
                measured,
                seeds,
                _verdict(mine["mean"] >= peer["mean"] + 0.1, seeds, planned),
            ]
        )
    if runs:
        below = max(r.get("below_start") or 0 for r in runs)
        rows.append(
            [
                "never below the start for more than one evaluation",
                f"at most {below}",
                len(runs),
                _verdict(below <= 1, len(runs), planned),
            ]
        )
    for arm in sorted(ASYNC, key=lambda a: a != mine_arm):  # the balance of the services: the judged arm first
        prefix = "" if arm == mine_arm else f"{ARMS[arm]}: "
        rows += [[prefix + rule, *rest] for rule, *rest in _balance_rows(record, arm, planned)]
    return rows


def _step_floor(record: Record, other: str, label: str) -> list[list[Any]]:
    """The async / on-policy ratio's floor on these cores: the recipe's time per step over the on-policy loop's
    time per cycle (generation, then the step), seed against seed. Where asynchrony needs at least as many steps
    as the on-policy loop to reach a target, its time ratio is no lower than this; a floor above 0.5 puts the
    target out of reach whatever the learning does."""
    cycles = {
        arm: {r["seed"]: (r.get("step") or {}).get("cycle") for r in (record["arms"].get(arm) or {}).get("runs", [])}
        for arm in (judged(record), other)
    }
    mine = cycles[judged(record)]
    seeds = sorted(set(mine) & set(cycles[other]))
    floor = ratio([mine[s] for s in seeds], [cycles[other][s] for s in seeds])
    if floor is None:
        return []
    verdict = "0.5 out of reach at equal steps" if floor["mean"] > 0.5 else "0.5 within reach at equal steps"
    rule = f"the ratio at equal steps: async time per step / {label} time per cycle"
    return [[rule, md.ratio(floor, None), floor["n"], verdict]]


def _balance_rows(record: Record, arm: str, planned: int) -> list[list[Any]]:
    """The targets on the balance of ``arm``'s two services: the trainer busy, and the distinct samples stored and
    trained (the share of the distinct samples stored that the trainer drew at least once, where the record counts
    it; in older records, the draws against the distinct samples stored, a sample drawn twice counting twice)."""
    runs = (record["arms"].get(arm) or {}).get("runs", [])
    rows: list[list[Any]] = []
    splits = [((r.get("time_split") or {}).get("trainer") or {}).get("busy_fraction") for r in runs]
    busy: list[float] = [b for b in splits if b is not None]
    if busy:
        rows.append(
            [
                "trainer busy ≥ 90% of the wall",
                f"{md.pct(min(busy), 0)} at the least",
                len(busy),
                _verdict(min(busy) >= 0.9, len(busy), planned),
            ]
        )
    counted = [r for r in runs if r.get("samples_stored") and r.get("samples_trained")]
    if not counted:
        return rows
    duplicates = max((r.get("samples_duplicate") or 0) / r["samples_generated"] for r in counted)
    distinct = [r for r in counted if r.get("samples_trained_distinct") is not None]
    if distinct:
        share = min(r["samples_trained_distinct"] / r["samples_stored"] for r in distinct)
        draws = max(r["samples_trained"] / r["samples_trained_distinct"] for r in distinct)
        measured = f"{share:.0%} of the distinct samples stored trained on at the least; each drawn {draws:.2f}× on "
        measured += "average at the most"
        counted, met = distinct, share >= 0.8
    else:
        trained_per_stored = max(r["samples_trained"] / r["samples_stored"] for r in counted)
        generated = max(abs(r["samples_trained"] / r["samples_generated"] - 1) for r in counted)
        measured = f"trained {trained_per_stored:.2f}× the distinct stored at the most; generated and trained within "
        measured += f"{generated:.0%}"
        met = trained_per_stored <= 1.2
    measured += f"; up to {duplicates:.0%} of those generated were duplicates"
    rule = "distinct samples stored and trained within 20%"
    return [*rows, [rule, measured, len(counted), _verdict(met, len(counted), planned)]]


def _samples(run: Record) -> str:
    parts = [run.get("samples_generated"), run.get("samples_stored"), run.get("samples_trained")]
    text = " / ".join("-" if p is None else f"{p:,}" for p in parts)
    distinct = run.get("samples_trained_distinct")
    return text if distinct is None else f"{text} ({distinct:,} distinct)"


def _time_table(record: Record) -> list[str]:
    """Per seed of each asynchronous arm: the trainer's and the searcher's time by part, as shares of the wall."""
    rows = []
    for arm in ASYNC:
        for r in (record["arms"].get(arm) or {}).get("runs", []):
            for service, split in (r.get("time_split") or {}).items():
                wall = split.get("wall_s") or 0.0
                busy = split.get("busy_fraction")
                busy_text = md.pct(busy, 0) if busy is not None else "-"
                rows.append([ARMS[arm], r["seed"], service, f"{wall:.0f} s", time_shares(split), busy_text])
    if not rows:
        return ["No time split recorded."]
    return md.table(["arm", "seed", "service", "wall", "shares of the wall", "trainer busy"], rows)


def _rate_table(record: Record) -> list[str]:
    """Per run of each ``tba up`` arm: the trainer's compute rate in each band of the batch's reward."""
    runs = [(arm, r) for arm in ARMS for r in (record["arms"].get(arm) or {}).get("runs", []) if r.get("compute_rate")]
    if not runs:
        return []
    bands = list(dict.fromkeys(band for _, r in runs for band in r["compute_rate"]))
    rows = [
        [
            ARMS[arm],
            r["seed"],
            *(
                f"{rate['tokens_per_s']:,.0f} ({rate['steps']})" if (rate := r["compute_rate"].get(band)) else "-"
                for band in bands
            ),
        ]
        for arm, r in runs
    ]
    lines = [
        "Tokens per second of the trainer's compute (reference, forward and backward) by the batch's mean reward, "
        "the steps in brackets. Within one band the arms differ in what runs beside the trainer (a generating "
        "searcher in the asynchronous arms, an idle one in the on-policy arms), not in how far the model has "
        "learned: a batch of converged answers shares more prefixes and computes faster per token.",
        "",
    ]
    return lines + md.table(["arm", "seed", *(f"reward {band}: tokens/s (steps)" for band in bands)], rows)


def claim(records: list[tuple[str, Record]], entry: Any) -> dict[str, Any] | None:
    """The README row: the recipe's accuracy from start to end and its time to the last target, and the ratios
    of that time against the on-policy loop and TRL where those arms have runs."""
    shown = by_task(records)
    if not shown:
        return None
    name, record = shown[0]
    last = _gains(record)[-1]
    mine = record["arms"][judged(record)]["summary"]
    ratios = {b: _pair(record, judged(record), b) for b in ("trl-grpo", "sync-tb")}
    labels = {"trl-grpo": "TRL", "sync-tb": "sync"}
    shown = []
    for b, p in ratios.items():
        if not p:
            continue
        seeds = f"{len(p['seeds'])} seed{'s' * (len(p['seeds']) > 1)}"
        if p["time_ratio"][last]:
            shown.append(f"time ratio async / {labels[b]} {p['time_ratio'][last]['mean']:.2f} ({seeds})")
        else:  # the other arm reached the target in no seed: its accuracy at the end says how far it got
            end = record["arms"][b]["summary"]["accuracy_end"]["mean"]
            shown.append(f"{labels[b]} never reached it, {md.pct(end)} at the end ({seeds})")
    result = (
        f"{md.pct(mine['accuracy_start']['mean'])} → {md.pct(mine['accuracy_end']['mean'])}, {_points(last)} in "
        f"{md.spread(mine['time_to'][last], unit=' s')}"
        + (f"; {', '.join(shown)}" if shown else "; TRL and sync arms not yet measured")
    )
    peer_end = (record["arms"].get("trl-grpo") or {}).get("summary", {}).get("accuracy_end")
    return entry(
        "real-model",
        "A pretrained model learns through the system",
        PAGE,
        record,
        [name],
        task=f"reasoning-gym {_options(record).get('dataset', '?')}",
        model=MODEL,
        budget=f"{record['minutes']:g} min",
        seeds=mine["accuracy_end"]["of"],
        settings="the real-model profile" + ("" if judged(record) == "async-tb-ahead" else ", its searcher free"),
        headline={
            "figure": f"held-out greedy accuracy start -> end, time to {_points(last)} over the raw model (from the "
            "first step), and its ratios async / TRL and async / sync (ratio of means)",
            "accuracy": {"start": mine["accuracy_start"], "end": mine["accuracy_end"]},
            "time_to": mine["time_to"][last],
            "async_over_trl": ratios["trl-grpo"] and ratios["trl-grpo"]["time_ratio"][last],
            "async_over_sync": ratios["sync-tb"] and ratios["sync-tb"]["time_ratio"][last],
            "trl_accuracy_end": peer_end,
        },
        result=result,
    )
