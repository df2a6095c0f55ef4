"""The suite's background preparations (tests/prewarm.py): the order it runs tests in, and its jobs' lifetimes."""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field

import pytest

from tba.local.lifetime import group_members
from tests import prewarm


@dataclass
class Item:
    nodeid: str
    fixturenames: list[str] = field(default_factory=list)


def test_stage_by_what_a_test_needs() -> None:
    assert prewarm.stage(["tmp_path", "redis_server"]) == 0
    assert prewarm.stage(["tmp_path", "sft_model"]) == 1
    assert prewarm.stage(["smollm2"]) == 1
    assert prewarm.stage(["sft_model", "docker_images"]) == 2


def test_order_moves_whole_modules_and_keeps_the_order_within_each_stage() -> None:
    items = [
        Item("deploy/test_smoke.py::test_run", ["docker_images"]),
        Item("e2e/test_a.py::test_one", ["sft_model"]),
        Item("e2e/test_a.py::test_two"),  # its module needs a model: stays with test_one
        Item("integration/test_b.py::test_x"),
        Item("integration/test_c.py::test_y", ["calculator_model"]),
        Item("unit/test_d.py::test_z"),
    ]
    prewarm.order(items)
    assert [item.nodeid for item in items] == [
        "integration/test_b.py::test_x",
        "unit/test_d.py::test_z",
        "e2e/test_a.py::test_one",
        "e2e/test_a.py::test_two",
        "integration/test_c.py::test_y",
        "deploy/test_smoke.py::test_run",
    ]


def test_start_launches_only_what_the_selected_tests_need(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(prewarm, "JOBS", {})  # this session's own jobs stay out of it
    prewarm.start([Item("unit/test_d.py::test_z", ["tmp_path"])])
    assert prewarm.JOBS == {}
    assert prewarm.wait_for("docker", 1) == ""  # never started: nothing to wait for


def test_a_stopped_job_leaves_nothing_of_its_group(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(prewarm, "JOBS", {})
    # A job whose command starts a child that would outlive it: stopping the job ends both.
    code = "import subprocess, time; subprocess.Popen(['sleep', '300']); time.sleep(300)"
    prewarm._launch("sleeper", [sys.executable, "-c", code], nice=0)
    job = prewarm.JOBS["sleeper"]
    try:
        time.sleep(1.0)
        group = job.proc.pid  # the guard leads the group
        assert job.stop() != 0
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and group_members(group):
            time.sleep(0.1)
        assert group_members(group) == []
        assert job.summary().startswith("sleeper: FAILED (exit -15)")
    finally:
        job.stop()


def test_wait_for_reports_how_the_job_went(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(prewarm, "JOBS", {})
    prewarm._launch("quick", [sys.executable, "-c", "print('ready')"], nice=0)
    try:
        line = prewarm.wait_for("quick", 60)
        assert line.startswith("quick: done in ") and "log " in line
        time.sleep(1.0)
        assert prewarm.JOBS["quick"].summary() == line  # the time it took, not the time since it started
        assert "ready" in prewarm.JOBS["quick"].log.read_text()
    finally:
        prewarm.JOBS["quick"].stop()
