"""`tba up` with its defaults (the searchers' and the trainer's cores split, a backfill searcher at the lowest
priority on the trainer's) for a few minutes: every searcher follows the trainer, and none lags in silence.

From what the run wrote: each searcher's served version advances through the run (summary.json's
``searcher_accounts``, polled versions), no checkpoint vanished under a searcher's lease and no reload failed,
no watcher died, and every stretch a searcher stayed more than the staleness bound behind for longer than
TBA_LAG_SECONDS is in the report's events with its time span. Each searcher's account (generated, stored,
trained on, too stale, lag) is in summary.json and the report.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tba.local.commands import tba_command
from tba.local.report import read_jsonl
from tba.settings import DEFAULT_MAX_STALENESS, SearcherSettings

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.vllm]

# Long enough for the backfill searcher, at the lowest priority on the trainer's busy cores, to start its engine
# (within a minute on 2 cores) and follow for two minutes more.
MINUTES = float(os.environ.get("TBA_E2E_FOLLOW_MINUTES", "3"))
LAG_SECONDS = SearcherSettings.model_fields["lag_seconds"].default


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory, sft_model: Path) -> dict:
    run_dir = tmp_path_factory.mktemp("follow") / "run"
    env = {k: v for k, v in os.environ.items() if not k.startswith("TBA_")}  # the defaults, as a new user has them
    cmd = tba_command(
        "up", no_console=True, minutes=MINUTES, run_dir=run_dir, base_model=sft_model, eval_every=60, eval_prompts=50
    )
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=MINUTES * 60 + 300)
    assert proc.returncode == 0, f"tba up failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return {
        "dir": run_dir,
        "summary": json.loads((run_dir / "summary.json").read_text()),
        "timeline": read_jsonl(run_dir / "timeline.jsonl"),
    }


def served(timeline: list[dict], name: str) -> list[tuple[float, int]]:
    """(seconds into the run, version served) at every poll that reached searcher ``name``."""
    out = []
    for row in timeline:
        version = ((row.get("searchers") or {}).get(name) or {}).get("version")
        if isinstance(version, int):
            out.append((row["t"], version))
    return out


def test_the_defaults_run_a_backfill_searcher_beside_the_searcher(run: dict) -> None:
    accounts = run["summary"]["searcher_accounts"]
    assert sorted(accounts) == ["searcher-0", "searcher-1"] and run["summary"]["searchers"] == 2


def test_every_searchers_served_version_advances_through_the_run(run: dict) -> None:
    """From its first reload on, in every third of the rest of the run each searcher serves a newer version."""
    published = run["summary"]["versions_published"]
    assert len(published) > 20
    for name, account in run["summary"]["searcher_accounts"].items():
        first, last = account["versions_served"]
        assert last > first >= 0, (name, account)
        points = [(t, v) for t, v in served(run["timeline"], name) if v > 0]
        assert points, f"{name} never reloaded"
        start, end = points[0][0], points[-1][0]
        thirds = [
            [v for t, v in points if start + i * (end - start) / 3 <= t <= start + (i + 1) * (end - start) / 3]
            for i in range(3)
        ]
        assert all(third and max(third) > min(third) for third in thirds), (name, thirds)


def test_no_searcher_lost_a_checkpoint_or_fell_back_and_no_watcher_died(run: dict) -> None:
    for name in run["summary"]["searcher_accounts"]:
        statuses = [(row.get("searchers") or {}).get(name) or {} for row in run["timeline"]]
        statuses = [st for st in statuses if "version" in st and st.get("state") != "loading"]
        assert statuses, f"{name} never served"
        last = statuses[-1]
        assert last["lost_checkpoints"] == 0 and last["reload_failures"] == 0, (name, last)
        assert last["watcher_errors"] == 0 and all(st["watcher_alive"] == 1 for st in statuses[1:-1]), name
        versions = [st["version"] for st in statuses]
        assert versions == sorted(versions), f"{name} went back to an older version (the base?)"


def test_no_silent_lag(run: dict) -> None:
    """A searcher's lag clock (how long it has served a version more than the bound behind the newest announced,
    without once coming back within it) never restarts while it serves the same version and stays over the
    bound; every poll at which it ran past TBA_LAG_SECONDS lies in a lagging event of the summary, with its time
    span, and every such event is in the report."""
    events = run["summary"]["events"]
    report = (run["dir"] / "report.html").read_text()
    spans = run["summary"]["searcher_warnings"]
    for name in run["summary"]["searcher_accounts"]:
        polls = [
            (row["t"], st)
            for row in run["timeline"]
            if isinstance((st := (row.get("searchers") or {}).get(name) or {}).get("version_lag"), int)
        ]
        for (t1, a), (t2, b) in zip(polls, polls[1:], strict=False):
            if a["version"] == b["version"] and a["version_lag"] > DEFAULT_MAX_STALENESS:
                # The same version served and newer ones announced meanwhile: it cannot have come back within the bound.
                assert b["lag_over_bound_s"] >= a["lag_over_bound_s"] + (t2 - t1) - 1.0, (name, t1, a, t2, b)
        for t, st in polls:
            if st["lag_over_bound_s"] > LAG_SECONDS:
                covering = [
                    w
                    for w in spans
                    if w["searcher"] == name and w["kind"] == "lagging" and w["start"] <= t <= (w["end"] or 1e9) + 1
                ]
                assert covering, (
                    f"{name} more than the bound behind for {st['lag_over_bound_s']:.0f} s at {t:.0f} s, no event"
                )
    lagged = [e for e in events if " lagging from " in e or " reload hung from " in e]
    assert len(lagged) == len(spans) and all(e[:60] in report for e in lagged)


def test_each_searchers_account_is_in_the_summary_and_the_report(run: dict) -> None:
    report = (run["dir"] / "report.html").read_text()
    buffer = run["summary"]["buffer"]
    accounts = run["summary"]["searcher_accounts"]
    assert (
        sum(a["samples_stored"] or 0 for a in accounts.values())
        == buffer["samples_ingested"] - buffer["samples_duplicate"] - buffer["samples_dead_lettered"]
    )
    for name, account in accounts.items():
        assert account["samples_generated"] >= (account["samples_stored"] or 0) > 0, (name, account)
        assert 0 <= account["samples_trained"] and account["version_lag_max"] >= 0
        assert 0 <= account["samples_too_stale"] <= account["samples_generated"]
        assert f"<th>{name}</th><td>{account['samples_generated']:,} generated" in report
