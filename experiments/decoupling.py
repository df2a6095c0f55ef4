"""Claim (1): decoupling search from training reaches a target accuracy sooner than on-policy training.

The paper runs search and training on separate GPUs; here they get separate cores of one machine,
in every arm: the searcher (its vLLM engine, reference pass and scoring) on CPU 0, the trainer on
CPU 1 (``tba up --searcher-cpus 0 --trainer-cpus 1``). The held-out evaluations take nothing from either:
every 5 s the newest checkpoint is set aside, and all are evaluated after the run (``tba up --eval-after``),
each at the time it was taken. Both arms start from the same cached SFT base on two-digit addition and train
with the TB loss for the same wall-clock budget, each at its best:

- ``async-tb``: the system with its defaults: the searcher runs free, the trainer draws from the replay
  buffer by the recency/reward rule within the bounds of bounded asynchrony (staleness and reuse,
  docs/algorithm.md §5), waiting for the searcher when a bound binds;
- ``sync-tb``: exactly on-policy: for each version the searcher generates one batch of the trainer's
  P prompts the moment the checkpoint is verified, then waits for the next
  (``TBA_MAX_BATCHES_PER_VERSION=1``); the trainer trains on exactly those samples (``only_version``,
  drawn as generated), its request held open by the buffer until they arrive, and publishes a checkpoint
  every step. Each core idles while the other works.

Every arm runs once per seed and budget: two budgets (5 and 10 minutes) so that no learning-rate
schedule, which decays over the last half of each run, decides the result.

``--generation-heavy`` runs both arms on the calculator task instead (tba/tasks/calculator.py): each
trajectory is a tool call, the tool's answer and the final answer, so the searcher makes two generate calls
and an environment step per trajectory where arithmetic makes one short call, and generation is most of the
synchronous cycle instead of a third: the paper's regime, where generation dominates. Its targets start
lower (its SFT base is at 27 %, arithmetic's at 34.5 %). Recorded per budget (one record under
docs/results/data/decoupling/, rendered into docs/results/decoupling.md by ``python -m experiments.report``):
per run, the times and samples to 50/60/70/80 % held-out greedy accuracy, accuracy at the start, lowest and end,
trainer steps, the update-to-data ratio (samples trained on per sample generated), the staleness of the
samples trained on, each core's busy fraction, the synchronous cycle's parts and the held-out curve; per arm
the spreads over seeds; per pair of arms the async / sync ratios of the times and samples.

``--more-search`` adds both arms with a second searcher on the trainer's core, the lever of the paper's
regime (more search for the same trainer): ``async-tb-backfill`` (``tba up --backfill 1``: a searcher at the
lowest priority that generates while the trainer waits for data) and ``sync-tb-2-searchers`` (two searchers,
one per core, each generating half of a step's prompts the moment the checkpoint is verified). The ratios are
reported for every asynchronous arm against every synchronous one.

``--lr-arm async=4.5e-5`` (repeatable; ``sync=LR`` likewise) adds that arm at another peak learning rate
(``TBA_LR``), run interleaved with the others: whether a mode's default rate is its best on this machine.
``--env-arm async:TBA_LR_MIN_RATIO=0.45`` (repeatable; several settings separated by commas) adds that mode's arm
with any other settings the same way.

Cost: arms (2; 4 with ``--more-search``; one more per ``--lr-arm`` or ``--env-arm``) x seeds x (each budget + ~1
min start-up and shutdown + the evaluations after the run, 25-45 s); 2 arms, 3 seeds at 5 and 10 minutes: ~105 min.
Run alone: ``python -m experiments.decoupling [--seeds 3] [--minutes 5 10] [--generation-heavy] [--more-search]
[--lr-arm MODE=LR] [--env-arm MODE:TBA_NAME=VALUE]``.
"""

from __future__ import annotations

import argparse
import math
import re
import statistics
from collections.abc import Sequence
from pathlib import Path

from experiments.arms import Arm, curve, first_at, parse_args, ratio_spread, run_interleaved, time_to, write_record
from experiments.records import provenance, ratio, record_name, resolved_settings, slug, summarize
from tba.local.report import read_jsonl, staleness_counts

# Accuracy targets per task: the held-out greedy accuracies whose times to reach are compared.
TARGETS = {"arithmetic": (0.5, 0.6, 0.7, 0.8), "calculator": (0.4, 0.5, 0.6, 0.7)}
PLACEMENT = {"searcher_cpus": "0", "trainer_cpus": "1"}
EVAL_EVERY = 5.0  # seconds between the checkpoints evaluated (after the run): the resolution of a time to target
COARSE = 3  # the ratios again on every COARSE-th of them (15 s: the grid of the rounds evaluated during the run)
SYNC_ENV = {"TBA_MAX_BATCHES_PER_VERSION": "1", "TBA_PROMPTS_PER_BATCH": "8"}


def lr_arm(text: str) -> tuple[str, dict[str, str]]:
    """``--lr-arm``'s value, ``MODE=LR``: a trainer mode and the peak learning rate of its extra arm."""
    mode, _, value = text.partition("=")
    try:
        lr = float(value)
    except ValueError:
        lr = math.nan
    if mode not in ("async", "sync") or not 0.0 < lr <= 1.0:
        raise argparse.ArgumentTypeError(f"{text!r}: expected async=LR or sync=LR with 0 < LR <= 1, e.g. async=4.5e-5")
    return mode, {"TBA_LR": f"{lr:g}"}


def env_arm(text: str) -> tuple[str, dict[str, str]]:
    """``--env-arm``'s value, ``MODE:TBA_NAME=VALUE[,TBA_NAME=VALUE...]``: a trainer mode and the settings of its
    extra arm (each value is checked by ``tba up``, which names a bad one before anything starts)."""
    mode, _, rest = text.partition(":")
    env = dict(item.partition("=")[::2] for item in rest.split(",")) if rest else {}
    named = all(re.fullmatch(r"TBA_[A-Z0-9_]+", k) and v for k, v in env.items())
    if mode not in ("async", "sync") or not env or not named:
        raise argparse.ArgumentTypeError(
            f"{text!r}: expected MODE:TBA_NAME=VALUE[,TBA_NAME=VALUE] with MODE async or sync, "
            "e.g. async:TBA_LR_MIN_RATIO=0.45"
        )
    return mode, env


def arm_flag(mode: str, env: dict[str, str]) -> str:
    """The option that adds the extra arm (``mode``, ``env``): ``--lr-arm`` where only the peak rate differs."""
    if list(env) == ["TBA_LR"]:
        return f" --lr-arm {mode}={env['TBA_LR']}"
    return f" --env-arm {mode}:" + ",".join(f"{k}={v}" for k, v in env.items())


def arms(
    task: str, ablation: bool = False, more_search: bool = False, extra: Sequence[tuple[str, dict[str, str]]] = ()
) -> list[Arm]:
    """Both arms on ``task``; with ``ablation`` also the recency branch uniformly among the newest versions'
    prompts instead of each new group once, in arrival order; with ``more_search`` also both arms with a second
    searcher on the trainer's core: the asynchronous one a backfill searcher at the lowest priority, which
    generates while the trainer waits for data, the synchronous one two searchers that each generate half of a
    step's prompts at once, one per core (the trainer's core is idle while they do); each of ``extra``
    (mode, settings) that mode's arm again with those settings (``--lr-arm``, ``--env-arm``)."""
    common = {"task": task, "eval_every": EVAL_EVERY, "eval_after": True, **PLACEMENT}
    out = [Arm("async-tb", mode="async", **common), Arm("sync-tb", mode="sync", env=SYNC_ENV, **common)]
    for mode, env in extra:
        base = SYNC_ENV if mode == "sync" else {}
        suffix = "-".join(k.removeprefix("TBA_").lower().replace("_", "-") + v for k, v in env.items())
        out.append(Arm(f"{mode}-tb-{suffix}", mode=mode, env={**base, **env}, **common))
    if ablation:
        out.append(Arm("async-tb-uniform", mode="async", env={"TBA_RECENCY_ORDER": "newest"}, **common))
    if more_search:
        half = {**SYNC_ENV, "TBA_PROMPTS_PER_BATCH": str(int(SYNC_ENV["TBA_PROMPTS_PER_BATCH"]) // 2)}
        out.append(Arm("async-tb-backfill", mode="async", backfill=1, **common))
        out.append(Arm("sync-tb-2-searchers", mode="sync", backfill=1, env=half, **common))
    return out


def pairs(modes: dict[str, str]) -> list[tuple[str, str]]:
    """Every (asynchronous arm, synchronous arm) whose times are compared, in the arms' order (the defaults' pair
    first); ``modes``: each arm's trainer mode by name."""
    return [(a, s) for a, m in modes.items() if m == "async" for s, n in modes.items() if n == "sync"]


# Staleness of the samples trained on, in versions: the histogram's buckets (upper bounds; the last is open).
STALENESS_BUCKETS = (0, 1, 2, 4, 8, 16, 64)


def trainer_rows(run_dir: Path) -> list[dict]:
    return read_jsonl(run_dir / "trainer_metrics.jsonl")


def staleness_histogram(rows: list[dict]) -> dict[str, float]:
    """Share of the samples trained on per staleness bucket (``"0"``, ``"1"``, ``"2"``, ``"3-4"``, ... ``">64"``)."""
    counts = staleness_counts(rows)
    total = sum(counts.values()) or 1
    out, low = {}, 0
    for high in STALENESS_BUCKETS:
        name = str(high) if low == high else f"{low}-{high}"
        out[name] = sum(n for s, n in counts.items() if low <= s <= high) / total
        low = high + 1
    out[f">{STALENESS_BUCKETS[-1]}"] = sum(n for s, n in counts.items() if s > STALENESS_BUCKETS[-1]) / total
    return out


def coarse(evaluations: list[dict], every: int = COARSE) -> list[dict]:
    """The evaluations on a grid ``every`` times coarser: those taken at a multiple of ``every`` x EVAL_EVERY."""
    return [e for e in evaluations if round(e["t"] / EVAL_EVERY) % every == 0]


def training_time_to(summary: dict, rows: list[dict], target: float, every: int = 1) -> float | None:
    """Seconds from the trainer's first optimizer step to the first evaluation at or above ``target`` (on the
    grid ``every`` times coarser than the run's): the start-up before it (loading the engine and the models,
    the first batch) is the same in every arm and is not what decoupling speeds up."""
    t = time_to(coarse(summary["evaluations"], every), target)
    if t is None or not rows:
        return None
    return max(0.0, t - (rows[0]["ts"] - summary["started_at"]))


def samples_to(summary: dict, rows: list[dict], target: float) -> int | None:
    """Samples the trainer had trained on in the first checkpoint evaluated at or above ``target``: how far an arm's
    samples take it, apart from how fast it gets them (the time to the target is both)."""
    first = first_at(summary["evaluations"], target)
    if first is None:
        return None
    return sum(r["samples"] for r in rows if r["step"] <= first["version"])


def update_to_data(summary: dict) -> float | None:
    """Samples served to the trainer per generated sample the buffer took in (duplicates included)."""
    buffer = summary.get("buffer") or {}
    generated = buffer.get("samples_ingested") or 0
    return buffer.get("samples_served", 0) / generated if generated else None


def off_policy_distance(rows: list[dict]) -> float | None:
    """Mean |log pi_theta - log mu| over the samples trained on: how far the policy trained was from the ones that
    generated its samples (on fresh samples, the engine's and the trainer's arithmetic disagreeing)."""
    rows = [r for r in rows if r.get("behaviour_log_ratio_abs") is not None]
    samples = sum(r["samples"] for r in rows)
    return sum(r["behaviour_log_ratio_abs"] * r["samples"] for r in rows) / samples if samples else None


def cycle_parts(rows: list[dict]) -> dict[str, float] | None:
    """Median seconds per step: the whole cycle (step to step), the trainer's compute (the reference pass, where
    the trainer runs it, included) and its wait for the batch; the rest is publishing the checkpoint and the
    trainer's own bookkeeping."""
    if len(rows) < 3:
        return None
    return {
        "cycle": statistics.median(b["ts"] - a["ts"] for a, b in zip(rows, rows[1:], strict=False)),
        "compute": statistics.median(r["step_s"] for r in rows),
        "reference": statistics.median(r.get("ref_s", 0.0) for r in rows),
        "wait": statistics.median(r["wait_s"] for r in rows),
    }


def work_per_batch(run_dir: Path) -> dict[str, float] | None:
    """Mean seconds of each part of the work, from the last status the run polled: the searcher's generate call,
    its scoring and publishing, its reload pause, and the trainer's checkpoint publish."""
    last = None
    for snap in read_jsonl(run_dir / "timeline.jsonl"):
        searcher = snap.get("searchers", {}).get("searcher-0", {})
        if searcher.get("batches") and snap.get("trainer", {}).get("publish_s_mean") is not None:
            last = snap
    if last is None:
        return None
    searcher, trainer = last["searchers"]["searcher-0"], last["trainer"]
    return {
        "generate": searcher["generate_seconds"] / searcher["batches"],
        "score": searcher["score_seconds"] / searcher["batches"],
        "reload": searcher["reload_seconds"] / max(1, searcher["reloads"]),
        "publish": trainer["publish_s_mean"],
    }


def run_figures(summary: dict, run_dir: Path, targets: tuple[float, ...]) -> dict:
    """One run's figures for the record: accuracy, times and samples to each target, the trainer's step, the
    searcher's work, staleness, the CPUs' busy fractions and the held-out curve."""
    rows = trainer_rows(run_dir)
    ev = summary["evaluations"]
    parts, work = cycle_parts(rows), work_per_batch(run_dir)
    run: dict = {
        "seed": summary["seed"],
        "trainer_steps": summary.get("trainer_steps"),
        "accuracy": {"start": ev[0]["accuracy"], "lowest": min(e["accuracy"] for e in ev), "end": ev[-1]["accuracy"]},
        "time_to": {str(t): training_time_to(summary, rows, t) for t in targets},
        "coarse_time_to": {str(t): training_time_to(summary, rows, t, COARSE) for t in targets},
        "samples_to": {str(t): samples_to(summary, rows, t) for t in targets},
        "update_to_data": update_to_data(summary),
        "step": parts and {k: parts[k] for k in ("cycle", "compute", "wait")},
        "searcher": work and {k: work[k] for k in ("generate", "score")},
        "staleness": staleness_histogram(rows),
        "off_policy_distance": off_policy_distance(rows),
        "cpu_busy": summary.get("cpu_busy"),
        "peak_lr": max((r["lr"] for r in rows), default=None),
        "first_step_s": rows[0]["ts"] - summary["started_at"] if rows else None,
        "evaluations": curve(summary),
    }
    if summary.get("mode") == "sync" and parts and work:
        run["sync_cycle"] = {
            "cycle": parts["cycle"],
            "generate": work["generate"],
            "score": work["score"],
            "reload": work["reload"],
            "train": parts["compute"],
            "reference": parts["reference"],
            "checkpoint": work["publish"],
            "overhead": parts["cycle"] - parts["compute"] - sum(work.values()),
        }
    return run


def deviations(arm: Arm) -> dict[str, str]:
    """What an arm changes in the system's defaults: its own settings, beyond those that make the synchronous arm
    exactly on-policy, and a second searcher."""
    base = SYNC_ENV if arm.mode == "sync" else {}
    out = {k: v for k, v in arm.env.items() if base.get(k) != v}
    if arm.backfill:
        out["tba up --backfill"] = str(arm.backfill)
    return dict(sorted(out.items()))


def arm_summary(figures: list[dict], targets: tuple[float, ...]) -> dict:
    """The spreads over seeds the page tables show."""
    cpus = len(figures[0]["cpu_busy"] or [])
    return {
        "time_to": {str(t): summarize([f["time_to"][str(t)] for f in figures]) for t in targets},
        "accuracy_end": summarize([f["accuracy"]["end"] for f in figures]),
        "trainer_steps": summarize([f["trainer_steps"] for f in figures]),
        "update_to_data": summarize([f["update_to_data"] for f in figures]),
        "cpu_busy": [summarize([(f["cpu_busy"] or [None] * cpus)[i] for f in figures]) for i in range(cpus)],
    }


def record(
    arm_list: Sequence[Arm], runs: dict[str, list[dict]], task: str, minutes: float, out: Path, command: str
) -> dict:
    """The experiment's record for one budget (experiments/records.py): provenance, each arm's runs and spreads, the
    async / sync ratios of every pair, and the levers the extra arms measured."""
    targets = TARGETS[task]
    rec = {
        **provenance(),
        "experiment": "decoupling",
        "task": task,
        "minutes": minutes,
        "targets": list(targets),
        "command": command,
        "evaluation": {"every_s": EVAL_EVERY, "after_run": True, "prompts": 200, "coarse_every_s": COARSE * EVAL_EVERY},
        "code_differences": [],
        "arms": {},
        "pairs": [],
        "levers": [],
    }
    figures = {}
    for arm in arm_list:
        dirs = [out / arm.name / f"seed-{s['seed']}" for s in runs[arm.name]]
        figures[arm.name] = [run_figures(s, d, targets) for s, d in zip(runs[arm.name], dirs, strict=True)]
        rec["arms"][arm.name] = {
            "mode": arm.mode,
            "deviations": deviations(arm),
            "env": arm.env,
            "peak_lr": max((f["peak_lr"] for f in figures[arm.name] if f["peak_lr"]), default=None),
            "resolved": resolved_settings(dirs[0]),
            "summary": arm_summary(figures[arm.name], targets),
            "runs": figures[arm.name],
        }

    def ratios(a: str, b: str, key: str) -> dict:
        return {
            str(t): ratio([f[key][str(t)] for f in figures[a]], [f[key][str(t)] for f in figures[b]]) for t in targets
        }

    for a, b in pairs({arm.name: arm.mode for arm in arm_list}):
        rec["pairs"].append(
            {
                "async": a,
                "sync": b,
                "time_ratio": ratios(a, b, "time_to"),
                "coarse_time_ratio": ratios(a, b, "coarse_time_to"),
                "samples_ratio": ratios(a, b, "samples_to"),
            }
        )
    for arm in arm_list[2:]:  # the extra arms: each a lever beside its mode's default arm
        against = "async-tb" if arm.mode == "async" else "sync-tb"
        lever = ", ".join(f"{k}={v}" for k, v in deviations(arm).items())
        rec["levers"].append({"arm": arm.name, "against": against, "lever": lever, "outcome": "not adopted"})
    return rec


def main(argv: list[str] | None = None) -> int:
    flags = {
        "ablation": "Also run async-tb-uniform: the recency branch uniform instead of in arrival order.",
        "generation-heavy": "Run the arms on the calculator task (a tool call per trajectory) instead of arithmetic.",
        "more-search": "Also run both arms with a second searcher on the trainer's core (async-tb-backfill, "
        "sync-tb-2-searchers).",
    }
    options = {
        "lr-arm": {
            "type": lr_arm,
            "action": "append",
            "dest": "extra",
            "default": [],
            "metavar": "MODE=LR",
            "help": "Also run the asynchronous (async=LR) or synchronous (sync=LR) arm at peak learning rate LR; "
            "repeatable.",
        },
        "env-arm": {
            "type": env_arm,
            "action": "append",
            "dest": "extra",
            "metavar": "MODE:TBA_NAME=VALUE[,...]",
            "help": "Also run that mode's arm with these settings, e.g. async:TBA_LR_MIN_RATIO=0.45; repeatable.",
        },
    }
    args = parse_args(argv, "decoupling", __doc__, minutes=[5.0, 10.0], flags=flags, options=options)
    task = "calculator" if args.generation_heavy else "arithmetic"
    flags_used = (
        " --ablation" * args.ablation
        + " --generation-heavy" * args.generation_heavy
        + " --more-search" * args.more_search
        + "".join(arm_flag(mode, env) for mode, env in args.extra)
    )
    for minutes in args.minutes:  # one record per budget, written as soon as its runs are done
        out = args.out / (f"calculator-{minutes:g}min" if args.generation_heavy else f"{minutes:g}min")
        arm_list = arms(task, args.ablation, args.more_search, args.extra)
        runs = run_interleaved(arm_list, args.seeds, minutes, out)
        command = f"python -m experiments.decoupling --seeds {args.seeds} --minutes {minutes:g}{flags_used}"
        rec = record(arm_list, runs, task, minutes, out, command)
        extra = slug(flags_used.replace("--generation-heavy", ""))[:40] if flags_used.strip() else ""
        write_record(args.results, "decoupling", record_name(task, minutes, rec, extra), rec)
        for a, b in pairs({arm.name: arm.mode for arm in arm_list}):
            times = {name: [f["time_to"] for f in rec["arms"][name]["runs"]] for name in (a, b)}
            for t in TARGETS[task]:
                print(f"{a} / {b} at {t:.0%}: {ratio_spread(*([x[str(t)] for x in times[n]] for n in (a, b)))}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
