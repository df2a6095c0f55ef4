"""What a local run's report says of each searcher: the stretches it did not keep up (with their time span), and
what its work was worth (generated, stored, trained on, too stale, version lag), from the recorded timeline, the
trainer's per-step metrics and the buffer's final stats; and the summary and report that carry both."""

from __future__ import annotations

import json
from pathlib import Path

from tba.local.report import RunFacts, build_summary, summary_rows
from tba.local.searcher_accounts import account_line, searcher_accounts, warning_spans


def status(version: int, generated: int, **extra) -> dict:
    return {
        "version": version,
        "samples_generated": generated,
        "samples_too_stale": 0,
        "version_lag_mean": 1.0,
        "version_lag_max": 3,
        "version_lag": 1,
        "warning_kind": None,
        **extra,
    }


def lagging(version: int, generated: int, held: float, lag: int) -> dict:
    return status(
        version,
        generated,
        warning_kind="lagging",
        warning=f"serving v{version}, {lag} versions behind",
        warning_seconds=held,
        version_lag=lag,
    )


TIMELINE = [
    {"t": 10.0, "searchers": {"searcher-0": status(4, 100), "searcher-1": status(4, 50)}},
    {"t": 80.0, "searchers": {"searcher-0": status(60, 900), "searcher-1": lagging(4, 300, held=65.0, lag=56)}},
    {"t": 90.0, "searchers": {"searcher-0": status(70, 1000), "searcher-1": lagging(4, 350, held=75.0, lag=66)}},
    {"t": 95.0, "searchers": {"searcher-0": status(76, 1100), "searcher-1": status(74, 380)}},  # caught up
    {"t": 120.0, "searchers": {"searcher-0": status(90, 1400), "searcher-1": lagging(74, 500, held=20.0, lag=16)}},
]


def test_each_stretch_a_searcher_did_not_keep_up_is_a_span_from_when_it_began() -> None:
    spans = warning_spans(TIMELINE)
    assert [(s.searcher, s.kind, s.start, s.end, s.max_lag) for s in spans] == [
        ("searcher-1", "lagging", 15.0, 95.0, 66),  # over the bound since 80 - 65 s, until the poll at 95 s
        ("searcher-1", "lagging", 100.0, None, 16),  # still lagging at the last poll
    ]
    assert spans[0].as_event(120.0).startswith("searcher-1 lagging from 15 s to 95 s (80 s, up to 66 versions")
    assert "to the end of the run (20 s" in spans[1].as_event(120.0)
    assert warning_spans([{"t": 1.0, "searchers": {"s": status(1, 1)}}]) == []


def test_accounts_add_up_lives_and_take_stored_and_trained_from_the_buffer_and_trainer() -> None:
    timeline = [
        {"t": 1.0, "searchers": {"s": status(2, 400, samples_too_stale=10, version_lag_mean=2.0, version_lag_max=9)}},
        {"t": 2.0, "searchers": {"s": {"error": "ConnectError"}}},  # a missed poll
        {"t": 3.0, "searchers": {"s": status(0, 100, samples_too_stale=0, version_lag_mean=4.0, version_lag_max=5)}},
    ]  # restarted after the first poll: 400 + 100 generated
    steps = [{"samples_by_searcher": {"s": 64}}, {"samples_by_searcher": {"s": 64, "other": 8}}, {}]
    accounts = searcher_accounts(timeline, steps, {"searcher_samples": {"s": 300}})
    assert accounts["s"] == {
        "samples_generated": 500,
        "samples_stored": 300,
        "samples_trained": 128,
        "trained_per_generated": 128 / 500,
        "samples_too_stale": 10,
        "version_lag_mean": (2.0 * 400 + 4.0 * 100) / 500,
        "version_lag_max": 9,
        "versions_served": [2, 0],
        "restarts": 1,
    }
    assert account_line(accounts["s"]) == (
        "500 generated, 300 stored, 128 trained on (0.26x), 10 too stale; lag 2.4 mean, 9 max; v2 → v0"
    )


def test_the_summary_lists_accounts_and_spans_and_the_report_a_row_per_searcher(tmp_path: Path) -> None:
    (tmp_path / "timeline.jsonl").write_text("".join(json.dumps(row) + "\n" for row in TIMELINE))
    (tmp_path / "trainer_metrics.jsonl").write_text(json.dumps({"step": 1, "samples_by_searcher": {"searcher-0": 64}}))
    facts = RunFacts(tmp_path, "arithmetic", "async", "tb", 2, 0.0, [], {}, ["trainer exited with code 1"])
    summary = build_summary(facts, [2, 4], {"searcher_samples": {"searcher-0": 700, "searcher-1": 200}})
    assert summary["searcher_accounts"]["searcher-1"]["samples_stored"] == 200
    assert summary["searcher_accounts"]["searcher-0"]["samples_trained"] == 64
    assert [w["start"] for w in summary["searcher_warnings"]] == [15.0, 100.0]
    assert summary["events"][0] == "trainer exited with code 1" and len(summary["events"]) == 3
    assert "searcher-1 lagging from 15 s to 95 s" in summary["events"][1]
    rows = dict(summary_rows(summary | {"wall_seconds": 120.0, "accuracy_start": None}, TIMELINE))
    assert rows["searcher-1"].startswith("500 generated, 200 stored, 0 trained on (0.00x)")
    assert rows["events"] == "3 (listed below)"
