"""Where a run's processes go and what follows from it: the CPU split, and the settings ``tba up`` gives each
service (the profile's under this placement, the threads and cores it implies, and what its mode implies).
"""

from __future__ import annotations

import argparse
import os

from tba.local.profile import Placement


def split_cpus(cpus: list[int]) -> tuple[list[int] | None, list[int] | None]:
    """``--placement split``: (the searchers' CPUs, the trainer's), the trainer on the last half; on one CPU
    there is nothing to split (None, None: anywhere). With a backfill searcher, the best `make demo` measured
    on two cores (docs/results/demo.md)."""
    if len(cpus) < 2:
        return None, None
    half = len(cpus) - len(cpus) // 2
    return cpus[:half], cpus[half:]


def separate_cores(args: argparse.Namespace) -> bool:
    """Search and training placed on disjoint CPUs."""
    a, b = args.searcher_cpus, args.trainer_cpus
    return bool(a and b and not set(a) & set(b))


def searcher_cpus(args: argparse.Namespace, i: int) -> list[int] | None:
    """Searcher ``i``'s CPUs: the searchers' (``i`` past ``--searchers``: a backfill searcher, the trainer's)."""
    return args.searcher_cpus if i < args.searchers else args.trainer_cpus


def placement(args: argparse.Namespace) -> Placement:
    """What the profile's conditions are decided on, for this run (after :func:`check_args`)."""
    on_cpu = args.trainer_settings.device == "cpu" and args.trainer_procs == 1
    return Placement(separate_cores=separate_cores(args), trainer_on_cpu=on_cpu)


def mode_settings(args: argparse.Namespace, service: str) -> dict[str, str]:
    """What ``--mode`` sets for ``service``, over the profile and the environment: the trainer's mode, and with
    ``--mode sync`` the searchers' ``TBA_MAX_SAMPLES_AHEAD`` off (its counts would hold the older versions' samples
    that the exactly on-policy trainer never draws: services/searcher/pacing.py)."""
    if service == "trainer":
        return {"TBA_MODE": args.mode}
    if service == "searcher" and args.mode == "sync":
        return {"TBA_MAX_SAMPLES_AHEAD": "off"}
    return {}


def service_defaults(args: argparse.Namespace, service: str, i: int = 0) -> dict[str, str]:
    """What ``tba up`` sets for ``service`` (``all``, ``trainer``, ``searcher``, ``buffer``) unless the environment
    does: the profile's settings under this run's placement (tba/local/profiles/), then what follows from where
    each process runs: the trainer's torch threads, one per core of its own (else one, the searchers take the
    other core), and each searcher engine's worker on a core of its own (vLLM's CPU build pins every engine to
    the same core by default; ``i`` past ``--searchers``: a backfill searcher on the trainer's cores)."""
    out = args.profile.settings(service, placement(args))
    if service == "trainer":
        out["TBA_TORCH_THREADS"] = str(len(args.trainer_cpus or [0]))
    if service == "searcher":
        spread = searcher_cpus(args, i) or list(range(os.cpu_count() or 1))
        out["VLLM_CPU_OMP_THREADS_BIND"] = str(spread[i % len(spread)])
    return out


def config_layers(args: argparse.Namespace) -> dict[str, dict[str, tuple[str, str]]]:
    """Per service, every variable ``tba up`` sets over the service's own defaults, with its value and where it
    comes from: the run's flags, the profile (under this run's placement), where the process runs, or the
    environment, which wins over the last three; first, under ``run``, the run's own flags that a profile may
    set. Addresses, ports and paths of the run are left out."""
    profile = f"profile {args.profile.label}"
    from_flags = {"TBA_TASK": args.task, "TBA_SEED": str(args.seed)}
    trainer_flags = {
        "TBA_LOSS": args.loss,
        "TBA_MAX_SECONDS": f"{max(1.0, args.minutes * 60):.0f}",
        "TBA_TRAINER_PROCS": str(args.trainer_procs),
        **({"TBA_MAX_STEPS": str(args.max_steps)} if args.max_steps else {}),
    }
    services = {"buffer": ("buffer", 0), "trainer": ("trainer", 0)}
    services |= {f"searcher-{i}": ("searcher", i) for i in range(args.searchers + args.backfill)}
    # The run itself: the flags a profile's [run] table may set, and where each value came from.
    out: dict[str, dict[str, tuple[str, str]]] = {"run": {f"--{k}": v for k, v in args.run_sources.items()}}
    for name, (service, i) in services.items():
        chosen = args.profile.settings(service, placement(args))
        values = {
            key: (value, profile if key in chosen else "placement")
            for key, value in service_defaults(args, service, i).items()
        }
        flags = from_flags | (trainer_flags if service == "trainer" else {}) | mode_settings(args, service)
        values |= {k: (v, "tba up flags") for k, v in flags.items()}
        for key in list(values):
            if key in os.environ and values[key][1] != "tba up flags":
                values[key] = (os.environ[key], "environment")
        out[name] = values
    return out
