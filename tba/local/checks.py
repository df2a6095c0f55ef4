"""``tba up``'s checks of its flags and variables, before anything starts: each failure names what to fix.

:func:`check_args` also fills in what the flags resolve to (the services' settings, the profile, the base
model's directory, the CPU lists), which the rest of the launcher reads from ``args``.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from tba.health import free_port
from tba.local.placement import mode_settings, placement, separate_cores, split_cpus
from tba.local.profile import RUN_FLAGS, Profile, ProfileError
from tba.procs import parse_cpu_list


class UsageError(ValueError):
    """A flag or variable ``tba up`` cannot run with; the message names it."""


def check_args(args: argparse.Namespace) -> None:
    """Every check of ``tba up``'s flags and variables, cheapest first, each failure a :class:`UsageError` or a
    :class:`~tba.settings.SettingsError` naming what to fix; fills in what they resolve to (the searchers'
    settings, the base model's directory, the trainer's processes, the CPU lists). The services' own settings
    are checked by the settings classes, here as in each service."""
    from tba.settings import SearcherSettings, TrainerSettings, load_settings
    from tba.tasks import make_task

    try:
        args.profile = args.profile if isinstance(args.profile, Profile) else Profile.load(args.profile)
    except ProfileError as err:
        raise UsageError(f"--profile: {err}") from None
    apply_run_table(args)
    if not 0.5 <= args.eval_every <= 86400:
        raise UsageError(f"--eval-every must be in [0.5, 86400] seconds, got {args.eval_every:g}")
    if args.eval_prompts < 1:
        raise UsageError(f"--eval-prompts must be at least 1, got {args.eval_prompts}")
    if args.searchers is not None and args.searchers < 1:
        raise UsageError(f"--searchers must be at least 1, got {args.searchers}")
    if args.placement not in ("split", "shared"):  # TBA_PLACEMENT reaches the flag's default unchecked
        raise UsageError(f"--placement / TBA_PLACEMENT must be split or shared, got {args.placement!r}")
    if args.wandb not in ("off", "offline", "online"):  # TBA_WANDB reaches the flag's default unchecked
        raise UsageError(f"--wandb / TBA_WANDB must be off, offline or online, got {args.wandb!r}")
    if args.wandb != "off" and importlib.util.find_spec("wandb") is None:
        raise UsageError(f"--wandb {args.wandb} needs Weights & Biases: pip install 'tba[wandb]'")
    if shutil.which("redis-server") is None:
        raise UsageError("redis-server not found: apt-get install -y redis-server")
    with profile_env(args.profile.settings("trainer", None)):
        args.trainer_settings = load_settings(  # the trainer's settings as tba up will start it
            TrainerSettings,
            trainer_procs=args.trainer_procs,
            mode=args.mode,
            loss=args.loss,
            max_steps=args.max_steps,
            max_seconds=max(1.0, args.minutes * 60),
        )
    args.trainer_procs = args.trainer_settings.trainer_procs
    try:
        args.trainer_cpus = _placement(args.trainer_cpus, "--trainer-cpus")
        args.searcher_cpus = _placement(args.searcher_cpus, "--searcher-cpus")
    except ValueError as err:
        raise UsageError(str(err)) from None
    on_cpu = args.trainer_settings.device == "cpu" and args.trainer_procs == 1
    split = args.placement == "split" and on_cpu and args.trainer_cpus is None and args.searcher_cpus is None
    if split:
        args.searcher_cpus, args.trainer_cpus = split_cpus(sorted(os.sched_getaffinity(0)))
    if args.searchers is None:
        args.searchers = min(2, len(args.searcher_cpus)) if separate_cores(args) else 2
    if args.backfill is None:  # the trainer's idle cycles, searched in: asynchronous training only
        args.backfill = 1 if split and separate_cores(args) and args.mode == "async" else 0
    if not 0 <= args.backfill <= 8:
        raise UsageError(f"--backfill must be in [0, 8], got {args.backfill}")
    if args.backfill and not separate_cores(args):
        raise UsageError(
            "--backfill puts searchers on the trainer's cores: it needs search and training on cores of their own "
            "(--placement split, or --searcher-cpus and --trainer-cpus)"
        )
    # What the run's own evaluations need from the searchers' settings (the task, prompt form, lengths): as the
    # searchers will read them, the profile's included.
    with profile_env(args.profile.settings("searcher", placement(args)) | mode_settings(args, "searcher")):
        args.searcher_settings = load_settings(SearcherSettings, task=args.task)
    ahead, trainer = args.searcher_settings.max_samples_ahead, args.trainer_settings
    if ahead is not None and args.mode == "sync":  # from the environment: --mode sync turns a profile's cap off
        raise UsageError(
            f"TBA_MAX_SAMPLES_AHEAD={ahead} with --mode sync: the exactly on-policy trainer never draws the samples of "
            "older versions, so the cap would count them for good and pause the searchers for good; pace them by "
            "version instead (TBA_MAX_BATCHES_PER_VERSION=1)"
        )
    need = max(trainer.warmup_samples, trainer.prompts_per_step * trainer.train_samples_per_prompt)
    if ahead is not None and ahead < need:
        raise UsageError(
            f"TBA_MAX_SAMPLES_AHEAD={ahead} is below the {need} samples the trainer waits for (its warm-up, or one "
            "batch): the searchers would pause while the trainer waits for them"
        )
    try:
        task = make_task(args.task, args.searcher_settings.task_options)
    except ValueError as err:
        raise UsageError(f"--task: {err}") from None
    args.served = None
    if args.env_server:
        args.served = served_task(args.task, task, args.searcher_settings.task_options, free_port())
        args.task = "openenv"
        args.searcher_settings = load_settings(SearcherSettings, task="openenv", task_options=args.served.options)
    if args.base_model is not None:
        from tba.model.importer import ModelImportError, resolve_model

        try:
            args.base_model = resolve_model(args.base_model).resolve()
        except ModelImportError as err:
            raise UsageError(f"--base-model: {err}") from None
        if not (args.base_model / "config.json").is_file():
            raise UsageError(
                f"--base-model: {args.base_model} is neither a model directory (no config.json) nor a packaged "
                "model's name"
            )


@contextlib.contextmanager
def profile_env(values: dict[str, str]) -> Iterator[None]:
    """The environment as a service started by ``tba up`` sees it: the profile's ``values`` where the environment
    sets nothing (the environment wins), for settings read here as the service will read them."""
    added = {k: v for k, v in values.items() if k not in os.environ}
    os.environ.update(added)
    try:
        yield
    finally:
        for key in added:
            os.environ.pop(key, None)


def apply_run_table(args: argparse.Namespace) -> None:
    """The flags not given on the command line (None) from the profile's ``[run]`` table, else their defaults;
    ``args.run_sources`` says where each came from (for ``--print-config``)."""
    args.run_sources = {}
    for flag, (_, default) in RUN_FLAGS.items():
        dest = flag.replace("-", "_")
        if getattr(args, dest) is not None:
            source = "environment" if flag == "task" and os.environ.get("TBA_TASK") == args.task else "tba up flags"
        elif flag in args.profile.run:
            setattr(args, dest, args.profile.run[flag])
            source = f"profile {args.profile.label}"
        else:
            setattr(args, dest, default)
            source = "tba up's default"
        if getattr(args, dest) is not None:
            args.run_sources[flag] = (str(getattr(args, dest)), source)


@dataclass(frozen=True)
class ServedTask:
    """--env-server: the multi-turn task ``tba envserver`` serves, and the openenv task's options for it."""

    name: str
    options: dict  # the openenv task's: the server's url and the served task's turn limits
    served_options: dict  # the served task's own (TBA_TASK_OPTIONS as given)
    port: int

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def served_task(name: str, task: Any, served_options: dict, port: int) -> ServedTask:
    """What --env-server serves and how the searchers reach it; a single-turn task is a usage error."""
    from tba.tasks import MultiTurnTask

    if not isinstance(task, MultiTurnTask):
        raise UsageError(f"--env-server serves multi-turn tasks; {name!r} is single-turn")
    options = {
        "url": f"http://127.0.0.1:{port}",
        "max_turns": task.max_turns,
        "max_episode_tokens": task.max_episode_tokens,
        "turn_stop": list(task.turn_stop),
    }
    return ServedTask(name, options, dict(served_options), port)


def _placement(text: str | None, flag: str) -> list[int] | None:
    """A CPU list option as CPUs this process may use (None: anywhere)."""
    if text is None:
        return None
    cpus, allowed = parse_cpu_list(text, flag), os.sched_getaffinity(0)
    if not cpus or not set(cpus) <= allowed:
        raise ValueError(
            f"{flag}={text!r}: CPUs {sorted(set(cpus) - allowed) or 'none'} are not among this "
            f"machine's {sorted(allowed)}"
        )
    return cpus
