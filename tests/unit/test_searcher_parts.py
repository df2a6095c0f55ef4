"""Pure parts of the searcher: rates, seeds, the metrics view of the status."""

from __future__ import annotations

import signal

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from services.searcher.loop import AbandonBatch, StopControl, distinct_prompts, replica_seed
from services.searcher.metrics import EXPORTED, RateWindow, StatusCollector
from tba.tasks import Prompt


def test_rate_window() -> None:
    now = [0.0]
    rates = RateWindow(window=10.0, clock=lambda: now[0])
    now[0] = 2.0
    rates.add(groups=2, samples=16, tokens=160)
    now[0] = 4.0
    assert rates.rates() == (0.5, 4.0, 40.0)  # 4 s since start
    now[0] = 20.0  # the event left the window
    assert rates.rates() == (0.0, 0.0, 0.0)


def test_replica_seeds_differ_by_id_and_are_stable() -> None:
    assert replica_seed(0, "searcher-0") == replica_seed(0, "searcher-0")
    seeds = {replica_seed(0, f"searcher-{i}") for i in range(50)}
    assert len(seeds) == 50
    assert replica_seed(1, "searcher-0") != replica_seed(0, "searcher-0")


def test_status_exported_as_prometheus() -> None:
    status = {name: 3 for name in EXPORTED} | {"version": 7, "searcher_id": "s", "state": "running"}
    registry = CollectorRegistry()
    registry.register(StatusCollector(lambda: status))
    text = generate_latest(registry).decode()
    assert "tba_searcher_version 7.0" in text
    assert "tba_searcher_groups_published_total 3.0" in text
    assert "tba_searcher_tokens_per_s 3.0" in text
    assert "tba_searcher_spilled 3.0" in text


def test_first_signal_finishes_the_batch_second_abandons_it() -> None:
    stop = StopControl()
    stop.generating = True
    stop.on_signal(signal.SIGTERM)  # first: only asks to stop after this batch
    assert stop.requested
    with pytest.raises(AbandonBatch):
        stop.on_signal(signal.SIGTERM)  # second, mid-generation: cuts the batch short
    stop.generating = False
    stop.on_signal(signal.SIGTERM)  # between batches there is nothing to abandon: no exception


def test_a_batch_takes_each_prompt_once_unless_the_task_has_too_few() -> None:
    def stream(ids):
        for i in ids:
            yield Prompt(prompt_id=str(i), text=str(i), answer="")

    picked = distinct_prompts(stream([1, 1, 2, 1, 3, 2, 4]), 4)
    assert [next(picked).prompt_id for _ in range(4)] == ["1", "2", "3", "4"]
    few = distinct_prompts(stream([7] * 100), 3)  # one prompt only: after 30 repeats they come through
    assert [next(few).prompt_id for _ in range(3)] == ["7", "7", "7"]
