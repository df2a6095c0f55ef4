"""Pure parts of the run report: reading metrics files that a kill may have cut, time to a target, the
figures of its summary and the series of its plots."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from tba.local.report import (
    MAX_CELL,
    quantile,
    rate_series,
    read_jsonl,
    samples_generated,
    smooth,
    staleness_over_steps,
    summary_rows,
    time_to_accuracy,
)


def test_read_jsonl_skips_a_cut_last_line(tmp_path: Path) -> None:
    p = tmp_path / "m.jsonl"
    p.write_text('{"step": 1}\n{"step": 2}\n{"ste')
    assert read_jsonl(p) == [{"step": 1}, {"step": 2}]
    assert read_jsonl(tmp_path / "missing.jsonl") == []


def test_time_to_accuracy_is_the_first_crossing() -> None:
    evals = [
        {"t": 0, "accuracy": 0.2},
        {"t": 30, "accuracy": 0.55},
        {"t": 60, "accuracy": 0.5},
        {"t": 90, "accuracy": 0.8},
    ]
    assert time_to_accuracy(evals, 0.5) == 30
    assert time_to_accuracy(evals, 0.8) == 90
    assert time_to_accuracy(evals, 0.9) is None


def test_quantile_of_a_counted_distribution() -> None:
    counts = Counter({0: 50, 3: 40, 200: 10})
    assert (quantile(counts, 0.5), quantile(counts, 0.9), quantile(counts, 0.95), quantile(counts, 1.0)) == (
        0,
        3,
        200,
        200,
    )
    assert quantile(Counter(), 0.5) is None


def test_staleness_over_steps_summarises_windows_of_steps() -> None:
    steps = [{"step": i, "staleness_hist": {"2": 9, "40": 1} if i < 10 else {"5": 10}} for i in range(20)]
    st = staleness_over_steps(steps, bins=2)
    assert st["step"] == [5, 15]
    assert st["p50"] == [2, 5] and st["p95"] == [40, 5]
    assert st["mean"] == pytest.approx([5.8, 5.0])
    assert staleness_over_steps([{"step": 1}]) == {"step": [], "p50": [], "p95": [], "mean": []}


def test_rate_series_is_a_trailing_window_of_a_cumulative_count() -> None:
    times = [0.0, 1.0, 2.0, 3.0, 4.0]
    counts = [0, 10, 20, 20, 60]
    assert rate_series(times, counts, window_s=2.0) == ([1.0, 2.0, 3.0, 4.0], [10.0, 10.0, 5.0, 20.0])


def test_smooth_keeps_length_and_levels() -> None:
    assert smooth([1.0, 1.0, 1.0, 1.0], 3).tolist() == [1.0, 1.0, 1.0, 1.0]
    assert smooth([0.0, 3.0, 0.0], 3).tolist() == pytest.approx([1.5, 1.0, 1.5])
    assert smooth([2.0], 1).tolist() == [2.0]


def test_samples_generated_adds_up_a_restarted_searcher() -> None:
    timeline = [
        {"searchers": {"s0": {"samples_generated": 100}, "s1": {"error": "ConnectError"}}},
        {"searchers": {"s0": {"samples_generated": 300}, "s1": {"samples_generated": 50}}},
        {"searchers": {"s0": {"samples_generated": 20}, "s1": {"samples_generated": 80}}},
    ]  # s0 restarted
    assert samples_generated(timeline) == 300 + 20 + 80
    assert samples_generated([{"searchers": {"s0": {"error": "x"}}}]) is None


def test_summary_rows_are_short_lines_never_lists() -> None:
    summary = {
        "task": "arithmetic",
        "mode": "async",
        "loss": "tb",
        "searchers": 2,
        "wall_seconds": 612.4,
        "accuracy_start": 0.345,
        "accuracy_end": 0.87,
        "trainer_steps": 4721,
        "evaluations": [{"t": 0, "version": 0, "accuracy": 0.345}, {"t": 300, "version": 2000, "accuracy": 0.9}],
        "time_to_accuracy_s": {"0.50": 372.0, "0.90": None},
        "versions_published": list(range(2, 4000, 2)),
        "buffer": {
            "samples_ingested": 20000,
            "samples": 3000,
            "prompts": 400,
            "samples_duplicate": 17000,
            "samples_evicted": 0,
            "samples_dead_lettered": 0,
            "samples_stored_total": 3000,
            "samples_served_distinct": 2400,
        },
        "staleness": {"mean": 79.8, "p95": 180, "max": 700},
        "restarts": {"searcher-1": 1},
        "events": ["x" * 500],
    }
    rows = dict(summary_rows(summary, []))
    assert all(len(v) <= MAX_CELL for v in rows.values())
    assert rows["held-out greedy accuracy"] == "34.5% → 87.0% (best 90.0% at v2000)"
    assert rows["time to accuracy"] == "50% at 372 s" and rows["targets not reached"] == "90%"
    assert rows["trainer steps"] == "4,721, 1999 versions published (last v3998)"
    assert rows["duplicates"] == "17,000 (85% of ingested)"
    assert rows["distinct samples trained on"] == "2,400 of 3,000 stored (80%)"
    assert rows["staleness of trained samples"] == "mean 79.8, p95 180, max 700 versions"
    assert rows["restarts"] == "searcher-1 1x" and rows["events"] == "1 (listed below)"
