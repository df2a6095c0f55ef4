"""Each core's busy fraction over a run, from /proc/stat's counters as the timeline records them; and the time split
the summary keeps from each service's last /status."""

from __future__ import annotations

from pathlib import Path

from tba.local.cpu_usage import read_cpu_times, utilization
from tba.local.report import time_line, time_split

STAT = """cpu  10 0 10 100 0 0 0 0 0 0
cpu0 5 0 5 50 0 0 0 0 0 0
cpu1 5 0 5 40 10 0 0 0 0 0
intr 123
"""


def test_counters_are_read_per_core_with_idle_and_iowait_as_not_busy(tmp_path: Path) -> None:
    stat = tmp_path / "stat"
    stat.write_text(STAT)
    assert read_cpu_times(stat) == {"cpu0": [10, 60], "cpu1": [10, 60]}
    assert read_cpu_times(tmp_path / "missing") == {}


def test_utilization_is_the_busy_share_between_the_first_and_last_rows_with_counters() -> None:
    rows = [
        {"t": 0},  # no counters: skipped
        {"t": 1, "cpus": {"cpu0": [10, 60], "cpu1": [10, 60]}},
        {"t": 2, "cpus": {"cpu0": [50, 110], "cpu1": [20, 160]}},
    ]
    assert utilization(rows) == {"cpu0": 0.8, "cpu1": 0.1}
    assert utilization(rows[:2]) == {}  # one reading says nothing


def test_the_time_split_is_each_services_last_status() -> None:
    trainer = {"wall_s": 10.0, "seconds": {"fetch": 1.0, "forward": 4.0, "other": 5.0}, "busy_fraction": 0.4}
    searcher = {"wall_s": 20.0, "seconds": {"generate": 15.0, "reload": 0.0, "other": 5.0}}
    timeline = [
        {"trainer": {"time": {"wall_s": 1.0}}, "searchers": {"searcher-0": {"error": "ConnectError"}}},
        {"trainer": {"time": trainer}, "searchers": {"searcher-0": {"time": searcher}}},
        {"trainer": {"error": "ConnectError"}, "searchers": {}},  # stopped: the last answer stands
    ]
    assert time_split(timeline) == {"trainer": trainer, "searcher-0": searcher}
    assert time_line(trainer) == "fetch 10%, forward 40%, other 50% of 10 s; busy 40%"
    assert time_line(searcher) == "generate 75%, other 25% of 20 s"
