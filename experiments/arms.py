"""What every experiment shares: one arm of ``tba up`` run per seed, and honest statistics over seeds.

An *arm* is a configuration of the system (task, trainer mode and loss, searchers, CPU placement,
extra ``TBA_`` settings); an experiment runs each arm once per seed, from the same cached SFT base,
one run after the other on the same machine. A finished run of the same budget is not run again (its
``summary.json`` is the record), so an interrupted experiment resumes where it stopped.

Statistics are over seeds and say how many seeds they cover: ``mean ± sd (min-max, n)``; a time
to a target that some seeds never reached is reported as "reached by k of n" with the times of
those that did, never averaged as if the others had. Each experiment writes its figures as a record
(experiments/records.py) and the results pages are rendered from the records (experiments/report/).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from experiments.records import RESULTS, ratio, summarize, write
from tba.local.commands import tba_command
from tba.local.cpu_usage import read_cpu_times
from tba.procs import die_with_parent


@dataclass(frozen=True)
class Arm:
    name: str
    task: str = "arithmetic"
    mode: str = "async"  # async | sync
    loss: str = "tb"  # tb | grpo
    searchers: int = 1
    backfill: int | None = None  # tba up --backfill: searchers on the trainer's cores at the lowest priority
    trainer_cpus: str | None = None  # tba up --trainer-cpus
    searcher_cpus: str | None = None  # tba up --searcher-cpus
    placement: str = "shared"  # tba up --placement, where no CPU list is given
    base_model: str | None = None  # tba up --base-model (default: the task's own SFT base)
    env: dict[str, str] = field(default_factory=dict)  # extra TBA_ settings of this arm
    eval_every: float | None = None  # tba up --eval-every (default: its own, 30 s)
    eval_after: bool = False  # tba up --eval-after: checkpoints taken every eval_every, evaluated after the run
    profile: str | None = None  # tba up --profile (default: its own, default)

    def command(self, seed: int, minutes: float, run_dir: Path, eval_prompts: int, keep_evaluated: bool) -> list[str]:
        return tba_command(
            "up",
            no_console=True,
            no_report=True,
            searchers=self.searchers,
            backfill=self.backfill,
            minutes=minutes,
            run_dir=run_dir,
            task=self.task,
            mode=self.mode,
            loss=self.loss,
            seed=seed,
            eval_prompts=eval_prompts,
            keep_evaluated=keep_evaluated,
            base_model=self.base_model,
            trainer_cpus=self.trainer_cpus,
            searcher_cpus=self.searcher_cpus,
            placement=self.placement,
            eval_every=self.eval_every,
            eval_after=self.eval_after,
            profile=self.profile,
        )


def parse_args(
    argv: list[str] | None,
    name: str,
    doc: str | None,
    minutes: float | list[float] = 10.0,
    flags: dict[str, str] | None = None,
    options: dict[str, dict[str, Any]] | None = None,
) -> argparse.Namespace:
    """The options every experiment takes: seeds, budget per run (several budgets where ``minutes`` is a list),
    where runs and results go; and the experiment's own on/off ``flags`` (option name -> help) and other
    ``options`` (option name -> ``add_argument``'s keywords)."""
    parser = argparse.ArgumentParser(
        prog=f"python -m experiments.{name}", description=doc, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seeds", type=int, default=3, help="Seeds per arm (default 3).")
    if isinstance(minutes, list):
        shown = " ".join(f"{m:g}" for m in minutes)
        parser.add_argument(
            "--minutes", type=float, nargs="+", default=minutes, help=f"Budgets of the runs (default {shown})."
        )
    else:
        parser.add_argument(
            "--minutes", type=float, default=minutes, help=f"Wall-clock budget of each run (default {minutes:g})."
        )
    parser.add_argument("--out", type=Path, default=Path("runs/experiments") / name, help="Run directories.")
    parser.add_argument(
        "--results", type=Path, default=RESULTS, help="The results folder: the record goes to its data/ folder."
    )
    for flag, text in (flags or {}).items():
        parser.add_argument(f"--{flag}", action="store_true", help=text)
    for option, keywords in (options or {}).items():
        parser.add_argument(f"--{option}", **keywords)
    return parser.parse_args(argv)


def cpu_times() -> list[tuple[int, int]]:
    """(busy, total) jiffies of each CPU since boot, in CPU order (:func:`tba.local.cpu_usage.read_cpu_times`)."""
    times = read_cpu_times()
    return [(busy, total) for _, (busy, total) in sorted(times.items(), key=lambda kv: int(kv[0][3:]))]


def busy_fractions(before: list[tuple[int, int]], after: list[tuple[int, int]]) -> list[float]:
    """Each CPU's busy fraction between two :func:`cpu_times` readings."""
    return [round((b1 - b0) / max(1, t1 - t0), 3) for (b0, t0), (b1, t1) in zip(before, after, strict=True)]


def run_child(cmd: Sequence[str], log: IO[bytes] | IO[str], env: dict[str, str]) -> None:
    """Run ``cmd`` to its end, its output to ``log``; raises if it fails. It gets SIGTERM when this process
    ends, however it ends (killed too), so an interrupted experiment leaves no run behind: ``tba up`` then
    stops its services in order."""
    subprocess.run(
        cmd,
        check=True,
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
        preexec_fn=lambda: die_with_parent(signal.SIGTERM),
    )


def run_arm(
    arm: Arm, seed: int, minutes: float, out: Path, eval_prompts: int = 200, keep_evaluated: bool = False
) -> dict:
    """One ``tba up`` run of ``arm`` with ``seed`` in ``out/<arm>/seed-<seed>``; its summary, with the CPUs'
    busy fractions over the run added (``cpu_busy``). ``keep_evaluated``: tba up --keep-evaluated."""
    run_dir = out / arm.name / f"seed-{seed}"
    summary_path = run_dir / "summary.json"
    if summary_path.exists():
        done = json.loads(summary_path.read_text())
        if done.get("state") == "complete" and done.get("minutes") == minutes:
            return done
    if run_dir.exists():  # an interrupted run, or another budget: start it again from scratch
        shutil.rmtree(run_dir)
    run_dir.mkdir(parents=True)
    cmd = arm.command(seed, minutes, run_dir, eval_prompts, keep_evaluated)
    print(f"[{time.strftime('%H:%M:%S')}] {arm.name} seed {seed}: {' '.join(cmd[2:])}", flush=True)
    before, started = cpu_times(), time.time()
    with (run_dir / "up.log").open("w") as log:
        run_child(cmd, log, {**os.environ, "TBA_TASK": arm.task, **arm.env})
    summary = json.loads(summary_path.read_text())
    summary["cpu_busy"] = busy_fractions(before, cpu_times())
    summary["arm"], summary["seed"], summary["minutes"] = arm.name, seed, minutes
    summary.setdefault("started_at", started)
    summary_path.write_text(json.dumps(summary, indent=1))
    return summary


def run_interleaved(arms: Sequence[Arm], seeds: int, minutes: float, out: Path, **kwargs) -> dict[str, list[dict]]:
    """Every arm for every seed, seed by seed (arm A seed 0, arm B seed 0, A seed 1, ...), so that a drift of the
    machine's speed over the hours touches every arm alike. Summaries by arm, in seed order."""
    runs: dict[str, list[dict]] = {arm.name: [] for arm in arms}
    for seed in range(seeds):
        for arm in arms:
            runs[arm.name].append(run_arm(arm, seed, minutes, out, **kwargs))
    return runs


def first_at(evaluations: Sequence[dict], target: float) -> dict | None:
    """The first held-out evaluation at or above ``target``; None if never."""
    return next((e for e in evaluations if e["accuracy"] >= target), None)


def time_to(evaluations: Sequence[dict], target: float) -> float | None:
    """Seconds to the first held-out evaluation at or above ``target``; None if never."""
    first = first_at(evaluations, target)
    return None if first is None else first["t"]


def spread(values: Sequence[float | None], fmt: str = "{:.1f}", unit: str = "") -> str:
    """``mean ± sd (min-max, n)`` of the values that exist; says how many of all there are when some are None."""
    s = summarize(values)
    if not s["n"]:
        return f"not reached (0 of {s['of']})"

    def show(v: float | int | None) -> str:
        return fmt.format(v) + unit

    text = show(s["mean"])
    if s["n"] > 1:
        text += f" ± {show(s['sd'])} ({show(s['min'])}-{show(s['max'])})"
    return text + (f", reached by {s['n']} of {s['of']}" if s["n"] < s["of"] else f", n={s['n']}")


def ratio_spread(num: Sequence[float | None], den: Sequence[float | None]) -> str:
    """Ratio of means with the range of per-seed ratios (seed i of one arm against seed i of the other)."""
    r = ratio(num, den)
    if r is None:
        return "n/a (not reached by both)"
    return f"{r['mean']:.2f} (per seed {r['min']:.2f}-{r['max']:.2f}, {r['n']} pairs)"


def curve(summary: dict) -> list[list[float]]:
    """A run's held-out evaluations as [seconds from launch, accuracy]: what a plot of the run is drawn from."""
    return [[round(e["t"], 1), e["accuracy"]] for e in summary["evaluations"]]


def write_record(results: Path, experiment: str, name: str, record: dict) -> Path:
    """Write the experiment's record under ``results``/data and rebuild every results page from the data."""
    from experiments import report

    path = write(experiment, name, record, results / "data")
    print(f"wrote {path}", flush=True)
    if results.resolve() == RESULTS.resolve():
        for changed in report.write():
            print(f"wrote {changed}", flush=True)
    return path
