"""Where a searcher's work runs on a CPU host, and what yields to what.

vLLM runs the generation engine as an engine-core process (the scheduler) and a worker process (the
model's compute). Generation is a chain of short steps, each waiting for the engine core to schedule
it, so the engine core's latency is generation's. The plan:

* the worker keeps the cores vLLM binds it to (``VLLM_CPU_OMP_THREADS_BIND``; ``auto``: every core
  of the first NUMA node but the last), alone;
* the engine core runs on the cores the worker leaves (the *spare* cores), and so do the searcher's
  own threads: the loop that drives the engine, and the scoring thread (reference pass, rewards,
  publishing), which overlaps the next batch;
* the scoring thread runs at a lower priority (``ref_nice``): a generation step must never wait for
  the engine core behind a reference forward.

Measured on 2 cores (benchmarks/searcher.py, services/searcher/README.md). Nothing here matters on
GPUs, where the compute is on the device; ``nobind`` (the kernel places everything) turns pinning off.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Iterable, Iterator, Mapping

from tba.procs import parse_cpu_list, pin_threads

log = logging.getLogger(__name__)
BIND_ENV = "VLLM_CPU_OMP_THREADS_BIND"


def allowed_cpus() -> list[int]:
    return sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))


def _vllm_auto_cpus() -> list[int]:
    """The generation worker's cores under vLLM's automatic binding."""
    try:
        from vllm.utils import cpu_resource_utils as cr

        node = cr.get_visible_memory_node()[0]
        per_core: dict[int, int] = {}
        for cpu in cr.get_allowed_cpu_list():  # one logical CPU per physical core (the highest id), as vLLM does
            if cpu.numa_node == node:
                per_core[cpu.physical_core] = max(cpu.id, per_core.get(cpu.physical_core, -1))
        cpus = sorted(per_core.values())
    except Exception as err:  # noqa: BLE001 (vLLM internals moved: assume one NUMA node)
        log.debug("cannot read vLLM's CPU topology (%s); assuming every allowed CPU is a core", err)
        cpus = allowed_cpus()
    return cpus[:-1] or cpus  # the last core is left to the engine core and the rest


def generation_cpus(environ: Mapping[str, str]) -> list[int] | None:
    """The generation worker's cores; None under ``nobind`` (the kernel places it)."""
    bind = environ.get(BIND_ENV, "auto")
    if bind == "nobind":
        return None
    return _vllm_auto_cpus() if bind == "auto" else parse_cpu_list(bind, BIND_ENV)


def spare_cpus(environ: Mapping[str, str] | None = None) -> list[int]:
    """The allowed cores the generation worker leaves free (empty: none, or the kernel places everything)."""
    gen = generation_cpus(os.environ if environ is None else environ)
    return [] if gen is None else [c for c in allowed_cpus() if c not in gen]


def engine_core_pids(llm) -> list[int]:
    """The engine-core processes of a vLLM ``LLM`` (none when the core runs in this process)."""
    core = getattr(getattr(llm, "llm_engine", None), "engine_core", None)
    manager = getattr(getattr(core, "resources", None), "engine_manager", None)
    return [p.pid for p in getattr(manager, "processes", None) or [] if p.pid is not None]


def pin_engine_core(llm, cpus: Iterable[int]) -> None:
    """Pin every thread of the engine-core processes to ``cpus`` (threads started later inherit it).

    The workers keep vLLM's own binding. Best effort: a host without /proc (or a process that exited)
    leaves the engine core where the kernel put it, which is slower but correct."""
    cpus = set(cpus)
    if not cpus:
        return
    for pid in engine_core_pids(llm):
        try:
            pin_threads(pid, cpus)
        except OSError as err:
            log.warning("could not pin engine core %d to cpus %s: %s", pid, sorted(cpus), err)


@contextlib.contextmanager
def pinned(cpus: Iterable[int]) -> Iterator[None]:
    """Run the calling thread (and the threads it starts) on ``cpus``, then put it back where it was.

    An empty ``cpus`` changes nothing."""
    cpus = set(cpus)
    before = os.sched_getaffinity(0) if cpus else None
    if cpus:
        os.sched_setaffinity(0, cpus)
    try:
        yield
    finally:
        if before is not None:
            os.sched_setaffinity(0, before)


def lower_thread_priority(nice: int) -> None:
    """Run the calling thread at niceness ``nice`` at least (Linux: niceness is per thread)."""
    if nice <= 0:
        return
    tid = threading.get_native_id()
    try:
        os.setpriority(os.PRIO_PROCESS, tid, max(nice, os.getpriority(os.PRIO_PROCESS, tid)))
    except OSError as err:
        log.warning("could not lower the scoring thread's priority to niceness %d: %s", nice, err)
