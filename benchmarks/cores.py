"""Cores benchmark: does each core compute as fast with the others busy as alone?

Asynchrony on a CPU host runs generation and training side by side, one core each. It pays only where two
cores compute in parallel: two virtual CPUs that are hyperthreads of one physical core, or cores that share
a memory bus the work saturates, each run at a fraction of their speed alone, and then the searcher and the
trainer take that fraction from each other (docs/scaling.md). This part measures it for the kernels that
dominate both services:

- a float32 matrix product (the trainer's forward and backward in float32, vLLM's matmuls);
- a bfloat16 matrix product (the trainer under bf16 autocast; emulated on a CPU without bf16 arithmetic);
- a streaming add over tensors larger than the caches (memory bandwidth: the optimizer, the KV cache).

Each kernel runs in one process per core, pinned, one torch thread: first on each core alone, then on every
core at once. The figure is a core's rate with every core busy, the baseline its rate alone; a ratio near 1
says the cores are independent, near 1 / cores that they share one core's units. Repeats alternate alone and
together so that load from elsewhere hits both; the median repeat counts.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import statistics
import time
from pathlib import Path
from typing import Any

from benchmarks import Figure

PART = "cores"
SECONDS, REPEATS = 3.0, 3  # per kernel and phase; alone and together alternate
MATMUL_N = 512  # a 512 x 512 product: 0.27 GFLOP, from the caches
STREAM_MB = 64  # per operand: larger than any core's cache
KERNELS = ("float32 matmul", "bfloat16 matmul", "stream add")
UNITS = {"float32 matmul": "GFLOP/s", "bfloat16 matmul": "GFLOP/s", "stream add": "GB/s"}


def settings(model: Path | None = None, quick: bool = False) -> dict[str, Any]:
    """What the part runs with, for its record: no model; the CPUs this process may use."""
    return {
        "kernels": list(KERNELS),
        "matmul_n": MATMUL_N,
        "stream_mb_per_operand": STREAM_MB,
        "seconds_per_phase": SECONDS,
        "repeats": REPEATS,
        "statistic": "median",
        "torch_threads": 1,
        "cpus": sorted(os.sched_getaffinity(0)),
    }


def _kernel(name: str):
    """The kernel's step (a callable) and the work one step does, in the unit's base (FLOP or bytes)."""
    import torch

    if name == "stream add":
        n = STREAM_MB * 2**20 // 4
        a, b, out = torch.ones(n), torch.ones(n), torch.empty(n)
        return (lambda: torch.add(a, b, out=out)), 3 * n * 4  # two reads and a write
    dtype = torch.float32 if name == "float32 matmul" else torch.bfloat16
    x, y = torch.randn(MATMUL_N, MATMUL_N, dtype=dtype), torch.randn(MATMUL_N, MATMUL_N, dtype=dtype)
    return (lambda: torch.mm(x, y)), 2 * MATMUL_N**3


def _worker(cpu: int, name: str, start: Any, seconds: float, out: Any) -> None:
    """On ``cpu`` alone: warm up, wait for the others at ``start`` (a barrier), run ``name`` for ``seconds``; put
    the rate."""
    os.sched_setaffinity(0, {cpu})
    import torch

    torch.set_num_threads(1)
    step, work = _kernel(name)
    for _ in range(3):
        step()
    start.wait()
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        step()
        n += 1
    out.put((cpu, n * work / (time.perf_counter() - t0) / 1e9))


def rates(cpus: list[int], name: str, seconds: float = SECONDS) -> dict[int, float]:
    """Each of ``cpus`` running ``name`` at once, one process each: its rate (GFLOP/s or GB/s)."""
    ctx = mp.get_context("spawn")
    out, start = ctx.Queue(), ctx.Barrier(len(cpus))
    procs = [ctx.Process(target=_worker, args=(cpu, name, start, seconds, out), daemon=True) for cpu in cpus]
    for p in procs:
        p.start()
    try:
        got = dict(out.get(timeout=60 + seconds) for _ in procs)
    finally:
        for p in procs:
            p.join(10)
            if p.is_alive():
                p.kill()
    return got


def measure(cpus: list[int], seconds: float = SECONDS, repeats: int = REPEATS) -> list[Figure]:
    """For each kernel: the mean rate of a core while all of ``cpus`` run it, against its rate alone (medians)."""
    figures = []
    for name in KERNELS:
        alone: list[float] = []
        together: list[float] = []
        for _ in range(repeats):
            alone.append(statistics.mean(rates([cpu], name, seconds)[cpu] for cpu in cpus))
            together.append(statistics.mean(rates(cpus, name, seconds).values()))
        figures.append(
            Figure(
                PART,
                f"{name}, per core with {len(cpus)} cores busy vs alone",
                statistics.median(together),
                UNITS[name],
                statistics.median(alone),
                f"1: independent cores; {1 / len(cpus):.2f}: one core's units shared",
            )
        )
    return figures


def main() -> list[Figure]:
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        raise RuntimeError(f"the cores benchmark needs 2 CPUs or more; this process may use {cpus}")
    return measure(cpus)


if __name__ == "__main__":
    from benchmarks import format_table

    print(format_table(main()))
