"""The cores benchmark measures what it names: each kernel's rate on the cores given, alone and together, from
processes pinned to them (real processes and kernels, short phases; the figures mean nothing at this length)."""

from __future__ import annotations

import os

import pytest

from benchmarks import cores


def test_rates_come_from_each_core_named_alone_and_together() -> None:
    cpus = sorted(os.sched_getaffinity(0))[:2]
    if len(cpus) < 2:
        pytest.fail(f"the cores benchmark needs 2 CPUs; this test may use {cpus}")
    alone = cores.rates(cpus[:1], "float32 matmul", seconds=0.2)
    together = cores.rates(cpus, "stream add", seconds=0.2)
    assert set(alone) == set(cpus[:1]) and set(together) == set(cpus)
    assert all(0 < rate < 1e5 for rate in [*alone.values(), *together.values()])  # GFLOP/s and GB/s, finite


def test_a_figure_per_kernel_against_the_core_alone(monkeypatch) -> None:
    calls: list[tuple[tuple[int, ...], str]] = []

    def fake_rates(cpus, name, seconds):  # the arithmetic of the figures, not the machine's speed
        calls.append((tuple(cpus), name))
        return {cpu: 10.0 if len(cpus) == 1 else 5.0 for cpu in cpus}

    monkeypatch.setattr(cores, "rates", fake_rates)
    figures = cores.measure([0, 1], seconds=0.1, repeats=1)
    assert [f.name.split(",")[0] for f in figures] == list(cores.KERNELS)
    assert all(f.value == 5.0 and f.baseline == 10.0 and f.ratio == 0.5 for f in figures)
    assert ((0,), "float32 matmul") in calls and ((1,), "float32 matmul") in calls and ((0, 1), "stream add") in calls
