"""A real pretrained model learns through the system: the real-model recipe against the exactly on-policy loop
and against TRL's GRPO, on the same work.

The recipe is ``tba up --profile real-model`` (tba/local/profiles/real-model.toml: SmolLM2-135M-Instruct on
reasoning-gym's aiw, asked in chat form and read by the lenient answer reader). Three arms, each run once
per seed, interleaved seed by seed on the same 2 cores:

- ``async-tb-ahead``: the recipe as it is: the searcher on CPU 0 stays one training batch ahead of the trainer's
  draws (``TBA_MAX_SAMPLES_AHEAD`` = P x K, as the profile sets it), the trainer on CPU 1 draws from the replay
  buffer within the bounds of bounded asynchrony: the next batch ready when the trainer asks, little generated
  that it never trains on;
- ``sync-tb``: the same recipe exactly on-policy, the fastest such loop the system runs on two cores: for each
  version the searcher generates one batch of the trainer's P prompts the moment the checkpoint is verified,
  the trainer trains on exactly those samples and publishes every step (``--mode sync``,
  ``TBA_MAX_BATCHES_PER_VERSION=1``); each core idles while the other works;
- ``sync-tb-2-cores`` (only when named in ``--only``): the same on-policy loop with the trainer on both cores
  (two torch threads, the reference pass its own as in ``sync-tb``; the searcher, on CPU 0, idles while it
  trains): where the trainer's step, not generation, sets the pace, the on-policy loop's other candidate for the
  fastest;
- ``async-tb-paced`` (only when named in ``--only``): the recipe with its searcher paced to one batch of the
  trainer's P prompts per version (``TBA_MAX_BATCHES_PER_VERSION=1``), the trainer drawing from the buffer as in
  ``async-tb``: samples at most a version old, and a searcher that generates no more than the trainer trains on.
  Under the reuse bound (a sample trained on once per sample generated) the trainer waits for each batch while the
  searcher waits for each checkpoint, so the two take turns much as in the on-policy loop;
- ``async-tb`` (only when named in ``--only``): the recipe with its searcher free (``TBA_MAX_SAMPLES_AHEAD=off``),
  as in the paper: it generates as fast as its core allows, the buffer replays and drops what the trainer does
  not draw;
- ``trl-grpo``: ``python -m experiments.peer`` with the same profile: TRL's ``GRPOTrainer`` on the same model,
  prompts, answer reader, completion length, held-out set and budget, generating with transformers, on both
  cores.

Held-out greedy accuracy on the recipe's held-out prompts: the ``tba up`` arms set a checkpoint aside every
:data:`EVAL_EVERY` seconds and evaluate all after the run (``--eval-after``), so the evaluations take nothing
from the run; the peer pauses its clock while it evaluates, every :data:`EVAL_EVERY` seconds of training.
Times count from the trainer's first optimizer step (the peer: the start of training), so that start-up
(engines, models, the first batch) is left out; the targets are +10, +20 and +30 points over the raw model's
accuracy, which every arm measures first.

Recorded (docs/results/data/real-model/, rendered into docs/results/real-model.md): per run the curve, the times
to each target, the accuracy at the start, lowest and end, steps, samples generated and trained on, and for the
``tba up`` arms where the trainer's and the searcher's time went; per arm the spreads over seeds; the ratios
async / sync and async / TRL of the times to each target. The record is rewritten after every run, so an
interrupted experiment keeps what it measured; ``--resume RECORD`` continues one, running only the runs it lacks,
on the CPU it was measured on (another CPU's runs would not compare within one record).

Cost: 3 arms x seeds x (budget + ~2 min of start-up, shutdown and evaluation); 3 seeds at 20 minutes: ~3.3 h.
``--task-options JSON`` runs every arm on another generator or difficulty than the profile's (a task with more
headroom, say), recorded apart from the recipe's own.
``python -m experiments.real_model [--seeds 3] [--minutes 20] [--only async-tb,trl-grpo] [--resume RECORD]
[--task-options JSON]``.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from experiments.arms import Arm, busy_fractions, cpu_times, curve, parse_args, run_arm, run_child, write_record
from experiments.decoupling import SYNC_ENV, cycle_parts, trainer_rows, update_to_data
from experiments.peer import parse_task_options, recipe, task_label
from experiments.records import provenance, ratio, record_name, resolved_settings, summarize
from experiments.report.real_model import DEFAULT_ARMS
from tba.local.profile import Profile
from tba.local.report import read_jsonl, time_split

PROFILE = "real-model"
TASK = "reasoning-gym"
GAINS = (0.1, 0.2, 0.3)  # the targets: points of held-out accuracy over the raw model's
EVAL_EVERY = 20.0  # seconds between the checkpoints evaluated: the resolution of a time to a target
PLACEMENT = {"searcher_cpus": "0", "trainer_cpus": "1", "backfill": 0}
PEER = "trl-grpo"
EXPERIMENT = "real-model"
RECIPE = "async-tb-ahead"  # the arm that runs the profile as it is
ON_POLICY = ("sync-tb", "sync-tb-2-cores")  # the exactly on-policy arms
# The arms whose times to each target are compared, seed against seed: each asynchronous arm against each on-policy
# one, and the recipe against the peer.
PAIRS = (
    *((a, b) for a in (RECIPE, "async-tb") for b in (*ON_POLICY, PEER)),
    *((a, "async-tb") for a in (RECIPE, "async-tb-paced")),
    *(("async-tb-paced", b) for b in ON_POLICY),
)
BATCH_SAMPLES = 64  # the recipe's training batch, P x K: 8 prompts x 8 samples
# The batch rewards that split the trainer's steps into before, while and after the model learns the task.
REWARD_BANDS = (
    ("below 0.25", float("-inf"), 0.25),
    ("0.25 to 0.75", 0.25, 0.75),
    ("0.75 and above", 0.75, float("inf")),
)
WARM_STEPS = 10  # the trainer's first steps run slower (on SmolLM2-135M about twice the later time, in every arm)


def arms(task_options: dict[str, Any] | None = None) -> dict[str, Arm | None]:
    """The arms by name, on the profile's task or on ``task_options`` in its place; the peer's is None (it is not
    a ``tba up`` run)."""
    common: dict[str, Any] = {"task": TASK, "profile": PROFILE, "eval_every": EVAL_EVERY, "eval_after": True}
    task_env = {} if task_options is None else {"TBA_TASK_OPTIONS": json.dumps(task_options)}

    def arm(name: str, mode: str, env: dict[str, str], **placement: Any) -> Arm:
        return Arm(name, mode=mode, env={**env, **task_env}, **common, **{**PLACEMENT, **placement})

    return {
        RECIPE: arm(RECIPE, "async", {"TBA_MAX_SAMPLES_AHEAD": str(BATCH_SAMPLES)}),
        "async-tb": arm("async-tb", "async", {"TBA_MAX_SAMPLES_AHEAD": "off"}),
        PEER: None,
        "sync-tb": arm("sync-tb", "sync", SYNC_ENV),
        # One batch of the trainer's P prompts per version: the searcher waits for each checkpoint, as the
        # on-policy loop's does, and the trainer draws from the buffer under the asynchronous bounds.
        "async-tb-paced": arm("async-tb-paced", "async", {**SYNC_ENV, "TBA_MAX_SAMPLES_AHEAD": "off"}),
        # Cores shared with the searcher would leave the reference pass on the searcher's one core.
        "sync-tb-2-cores": arm("sync-tb-2-cores", "sync", {**SYNC_ENV, "TBA_REF_PASS": "trainer"}, trainer_cpus="0,1"),
    }


def run_peer(seed: int, minutes: float, out: Path, task_options: dict[str, Any] | None = None) -> dict:
    """One TRL GRPO run of the recipe's work (on ``task_options`` where given) in ``out/trl-grpo/seed-<seed>``
    (reused where it finished)."""
    run_dir = out / PEER / f"seed-{seed}"
    summary_path = run_dir / "summary.json"
    if summary_path.exists():
        done = json.loads(summary_path.read_text())
        if done.get("budget_s") == minutes * 60:
            return done
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir(parents=True)
    cmd = [sys.executable, "-m", "experiments.peer", "--profile", PROFILE, "--minutes", f"{minutes:g}"]
    cmd += ["--seed", str(seed), "--eval-every", f"{EVAL_EVERY:g}", "--out", str(run_dir)]
    if task_options is not None:
        cmd += ["--task-options", json.dumps(task_options)]
    print(f"[{time.strftime('%H:%M:%S')}] {PEER} seed {seed}: {' '.join(cmd[1:])}", flush=True)
    before = cpu_times()
    with (run_dir / "peer.log").open("w") as log:
        run_child(cmd, log, dict(os.environ))
    summary = json.loads(summary_path.read_text())
    summary["cpu_busy"] = busy_fractions(before, cpu_times())
    summary_path.write_text(json.dumps(summary, indent=1))
    return summary


def gain_times(evaluations: list[dict], origin: float) -> dict[str, float | None]:
    """Seconds from ``origin`` to the first evaluation at or above the raw model's accuracy (the first evaluation)
    plus each gain; None where never reached."""
    start = evaluations[0]["accuracy"]
    out = {}
    for gain in GAINS:
        hit = next((e for e in evaluations if e["accuracy"] >= start + gain - 1e-9), None)
        out[f"+{gain:g}"] = None if hit is None else round(max(0.0, hit["t"] - origin), 1)
    return out


def below_start(evaluations: list[dict], origin: float) -> int:
    """Evaluations after the trainer's first step below the raw model's accuracy."""
    start = evaluations[0]["accuracy"]
    return sum(1 for e in evaluations[1:] if e["t"] >= origin and e["accuracy"] < start - 1e-9)


def compute_rates(rows: list[dict]) -> dict[str, dict[str, float]]:
    """The trainer's compute rate (tokens per second of reference, forward and backward) by the batch's reward.

    A batch of converged answers shares most of its prefixes, which the learner computes once, so a token costs
    less once the model has learned; arms compared within one band of reward leave learning's progress out of the
    comparison of their speed (the asynchronous trainer computes beside a generating searcher, the on-policy one
    beside an idle one). The first :data:`WARM_STEPS` steps (the trainer's warm-up) are left out."""
    bands: dict[str, list[float]] = {label: [] for label, _, _ in REWARD_BANDS}
    for r in rows[WARM_STEPS:]:
        seconds = r.get("ref_s", 0.0) + r.get("forward_s", 0.0) + r.get("backward_s", 0.0)
        if "reward_mean" in r and "tokens" in r and seconds > 0:
            label = next(label for label, lo, hi in REWARD_BANDS if lo <= r["reward_mean"] < hi)
            bands[label].append(r["tokens"] / seconds)
    return {
        label: {"steps": len(rates), "tokens_per_s": round(statistics.median(rates), 1)}
        for label, rates in bands.items()
        if rates
    }


def tba_figures(summary: dict, run_dir: Path) -> dict:
    """A ``tba up`` run's figures: the curve and times from the trainer's first step, steps, samples, time split."""
    rows = trainer_rows(run_dir)
    evals = summary["evaluations"]
    origin = rows[0]["ts"] - rows[0]["step_s"] - rows[0]["wait_s"] - summary["started_at"] if rows else 0.0
    buffer = summary.get("buffer") or {}
    accounts = summary.get("searcher_accounts") or {}
    return {
        "seed": summary["seed"],
        "first_step_s": round(origin, 1),
        "accuracy": _accuracy(evals),
        "time_to": gain_times(evals, origin),
        "below_start": below_start(evals, origin),
        "trainer_steps": summary.get("trainer_steps"),
        "samples_generated": sum(a.get("samples_generated") or 0 for a in accounts.values()),
        "samples_stored": buffer.get("samples_stored_total", buffer.get("samples")),
        "samples_trained": sum(r["samples"] for r in rows),
        "samples_trained_distinct": buffer.get("samples_served_distinct"),
        "samples_duplicate": buffer.get("samples_duplicate"),
        "samples_too_stale": sum(a.get("samples_too_stale") or 0 for a in accounts.values()),
        "update_to_data": update_to_data(summary),
        "step": cycle_parts(rows),
        "compute_rate": compute_rates(rows),
        "time_split": time_split_of(run_dir),
        "cpu_busy": summary.get("cpu_busy"),
        "evaluations": [[round(t - origin, 1), a] for t, a in curve(summary)],
    }


def peer_figures(summary: dict) -> dict:
    """The peer's figures: its curve and times from the start of training (its clock holds no evaluation)."""
    evals = summary["evaluations"]
    return {
        "seed": summary["seed"],
        "first_step_s": 0.0,
        "accuracy": _accuracy(evals),
        "time_to": gain_times(evals, 0.0),
        "below_start": below_start(evals, 0.0),
        "trainer_steps": summary.get("steps"),
        "samples_generated": summary.get("samples_trained"),
        "samples_trained": summary.get("samples_trained"),
        "cpu_busy": summary.get("cpu_busy"),
        "evaluations": [[round(e["t"], 1), e["accuracy"]] for e in evals],
    }


def time_split_of(run_dir: Path) -> dict:
    return time_split(read_jsonl(run_dir / "timeline.jsonl"))


def _accuracy(evals: list[dict]) -> dict[str, float]:
    return {
        "start": evals[0]["accuracy"],
        "lowest": min(e["accuracy"] for e in evals),
        "end": evals[-1]["accuracy"],
    }


def arm_summary(runs: list[dict]) -> dict:
    return {
        "time_to": {g: summarize([r["time_to"][g] for r in runs]) for g in runs[0]["time_to"]},
        "accuracy_start": summarize([r["accuracy"]["start"] for r in runs]),
        "accuracy_end": summarize([r["accuracy"]["end"] for r in runs]),
        "trainer_steps": summarize([r["trainer_steps"] for r in runs]),
    }


def pair(runs: dict[str, list[dict]], a: str, b: str) -> dict:
    """Time ratios a / b per target, seed against seed."""
    seeds = sorted({r["seed"] for r in runs[a]} & {r["seed"] for r in runs[b]})
    by_seed = {name: {r["seed"]: r for r in runs[name]} for name in (a, b)}
    ratios = {}
    for gain in (f"+{g:g}" for g in GAINS):
        num = [by_seed[a][s]["time_to"][gain] for s in seeds]
        den = [by_seed[b][s]["time_to"][gain] for s in seeds]
        ratios[gain] = ratio(num, den)
    return {"arms": [a, b], "seeds": seeds, "time_ratio": ratios}


def build_record(
    runs: dict[str, list[dict]],
    minutes: float,
    seeds: int,
    settings: dict,
    previous: dict | None,
    task_options: dict[str, Any],
    own: bool,
) -> dict:
    """The record of the runs so far, on ``task_options`` (``own``: the profile's, which the command leaves out)."""
    command = f"python -m experiments.real_model --seeds {seeds} --minutes {minutes:g}"
    rec = {
        **(previous or provenance()),
        "experiment": EXPERIMENT,
        "task": TASK,
        "task_options": task_options,
        "profile": PROFILE,
        "minutes": minutes,
        "seeds": seeds,
        "gains": list(GAINS),
        "command": command + ("" if own else f" --task-options '{json.dumps(task_options)}'"),
        "evaluation": {"every_s": EVAL_EVERY, "after_run": True, "prompts": settings.get("eval_prompts")},
        "settings": settings,
        "arms": {name: {"summary": arm_summary(r), "runs": r} for name, r in runs.items() if r},
        "pairs": [pair(runs, a, b) for a, b in PAIRS if runs.get(a) and runs.get(b)],
    }
    rec["date"] = provenance()["date"]
    return rec


def main(argv: list[str] | None = None) -> int:
    options = {
        "only": {
            "default": None,
            "help": f"Comma-separated arms to run (default: {', '.join(DEFAULT_ARMS)}; also sync-tb-2-cores).",
        },
        "resume": {
            "type": Path,
            "default": None,
            "help": "A record of this experiment to continue: its runs are kept.",
        },
        "task-options": {
            "default": None,
            "help": "The task's options as a JSON object, for every arm, in place of the profile's (default: the "
            "profile's); the record is named by the generator, with a digest of the options where they are not "
            "the profile's.",
        },
    }
    args = parse_args(argv, "real_model", __doc__, minutes=20.0, options=options)
    own_options = recipe(PROFILE)["task_options"]
    task_options = own_options
    if args.task_options is not None:
        try:
            task_options = parse_task_options(TASK, args.task_options)
        except ValueError as e:
            print(f"--task-options: {e}", file=sys.stderr)
            return 2
    own = task_options == own_options
    arm_list = arms(None if own else task_options)
    chosen = list(DEFAULT_ARMS) if args.only is None else args.only.split(",")
    unknown = [a for a in chosen if a not in arm_list]
    if unknown:
        print(f"--only: no arm {', '.join(unknown)}; the arms are {', '.join(arm_list)}", file=sys.stderr)
        return 2
    previous = json.loads(args.resume.read_text()) if args.resume else None
    if previous and (
        previous.get("experiment") != EXPERIMENT
        or previous.get("minutes") != args.minutes
        or previous.get("task_options", own_options) != task_options
    ):
        print(
            f"--resume: {args.resume} is not a {EXPERIMENT} record of {args.minutes:g} minutes on these task options",
            file=sys.stderr,
        )
        return 2
    machine = provenance()["machine"]
    if previous and previous.get("machine") != machine:
        print(
            f"--resume: {args.resume} was measured on {previous.get('machine')}, and this machine is "
            f"{machine}: runs on another CPU do not compare within one record; start a new one",
            file=sys.stderr,
        )
        return 2
    label = task_label(task_options, own_options)
    out = args.out / label
    runs: dict[str, list[dict]] = {
        name: list((previous or {}).get("arms", {}).get(name, {}).get("runs", [])) for name in arm_list
    }
    settings: dict = (previous or {}).get("settings", {})
    name = args.resume.stem if args.resume else None
    eval_prompts = int(Profile.load(PROFILE).run.get("eval-prompts", 48))
    for seed in range(args.seeds):
        for arm_name in chosen:
            if any(r["seed"] == seed for r in runs[arm_name]):
                continue
            arm = arm_list[arm_name]
            if arm is None:
                figures = peer_figures(run_peer(seed, args.minutes, out, None if own else task_options))
            else:
                summary = run_arm(arm, seed, args.minutes, out, eval_prompts=eval_prompts)
                run_dir = out / arm.name / f"seed-{seed}"
                figures = tba_figures(summary, run_dir)
                settings.setdefault("resolved", {})[arm_name] = resolved_settings(run_dir)
                settings["eval_prompts"] = eval_prompts
            runs[arm_name].append({**figures, "commit": provenance()["commit"]})
            rec = build_record(runs, args.minutes, args.seeds, settings, previous, task_options, own)
            name = name or record_name(label, args.minutes, rec)
            write_record(args.results, EXPERIMENT, name, rec)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
