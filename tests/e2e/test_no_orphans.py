"""Nothing of a ``tba up`` run outlives what it belongs to, with the real system: a searcher killed with
SIGKILL takes vLLM's engine core, worker and resource tracker with it before it is restarted, and
``tba up`` killed with SIGKILL takes every process of the run with it, leaving a whole summary of the
run so far. The run is placed as ``tba up`` places it by default (``--placement split`` with a backfill
searcher), and each service is checked to run where and how nicely that placement says."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from tba.local.commands import tba_command
from tba.local.lifetime import guarded_service
from tba.local.placement import split_cpus
from tba.local.supervisor import GRACE_SECONDS
from tba.local.up import SUMMARY_EVERY_SECONDS
from tba.process_tree import alive, command_line, descendants, running_with
from tests.waiting import wait_while_running

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.vllm]


def shared_memory(pids: set[int]) -> set[Path]:
    """The POSIX shared memory segments (files in /dev/shm) mapped by any of ``pids``."""
    found = set()
    for pid in pids:
        try:
            maps = Path(f"/proc/{pid}/maps").read_text()
        except FileNotFoundError:
            continue
        found |= {
            Path(line.split(maxsplit=5)[5])
            for line in maps.splitlines()
            if len(line.split(maxsplit=5)) == 6 and line.split(maxsplit=5)[5].startswith("/dev/shm/")
        }
    return found


def read_summary(run_dir: Path) -> dict:
    try:
        return json.loads((run_dir / "summary.json").read_text())
    except FileNotFoundError:
        return {}


def ready(url: str) -> bool:
    try:
        return httpx.get(f"{url}/readyz", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def placed(pid: int) -> tuple[list[int], int]:
    """The CPUs ``pid`` may run on and its nice value."""
    return sorted(os.sched_getaffinity(pid)), os.getpriority(os.PRIO_PROCESS, pid)


def test_sigkill_of_a_searcher_then_of_tba_up_leaves_nothing(tmp_path: Path, sft_model: Path) -> None:
    run_dir = tmp_path / "run"
    log = tmp_path / "up.log"
    cmd = tba_command(
        "up",
        no_console=True,
        no_report=True,
        searchers=1,
        minutes=10,
        run_dir=run_dir,
        base_model=sft_model,
        eval_every=600,
        eval_prompts=20,
    )
    with log.open("wb") as out:
        up = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=dict(os.environ))
    try:
        # 1. kill -9 of the searcher once vLLM's engine runs: its helpers go, then it is restarted.
        status_url = wait_while_running(
            "running summary", lambda: read_summary(run_dir).get("endpoints", {}).get("searcher-0"), 60, up, log
        )
        wait_while_running("searcher ready", lambda: ready(status_url), 300, up, log)
        searcher = guarded_service(up.pid, "searcher-0")
        assert searcher is not None
        # The default placement: the searcher on the first half of the CPUs, the trainer on the rest, and a
        # backfill searcher on the trainer's at the lowest priority.
        search_cpus, train_cpus = split_cpus(sorted(os.sched_getaffinity(0)))
        assert search_cpus and train_cpus, "the default placement needs 2 CPUs or more"
        services = {name: guarded_service(up.pid, name) for name in ("trainer", "searcher-1")}
        assert None not in services.values(), services
        assert placed(searcher) == (search_cpus, 0)
        assert placed(services["trainer"]) == (train_cpus, 0)
        assert placed(services["searcher-1"]) == (train_cpus, 19)
        # tba up itself (the console, the evaluations, the listeners) leaves the trainer's CPUs to the trainer.
        threads = [int(t.name) for t in Path(f"/proc/{up.pid}/task").iterdir()]
        assert {tid: sorted(os.sched_getaffinity(tid)) for tid in threads} == dict.fromkeys(threads, search_cpus)
        group = Path(f"/proc/{services['searcher-1']}/autogroup")
        if group.exists():  # sessions scheduled as groups: the backfill's group is as nice as the backfill
            assert group.read_text().split()[-2:] == ["nice", "19"]
        helpers = descendants(searcher)
        names = {pid: command_line(pid) for pid in helpers}
        trackers = {pid for pid, name in names.items() if "resource_tracker" in name}
        assert len(helpers) >= 3 and trackers and any("EngineCore" in n for n in names.values()), names
        shm = shared_memory(helpers | {searcher})
        assert shm, "vLLM's processes map no shared memory: nothing to check it is released"
        os.kill(searcher, signal.SIGKILL)
        wait_while_running(
            "the killed searcher's helpers to be gone",
            lambda: not any(alive(p) for p in helpers),
            GRACE_SECONDS + 5,
            up,
            log,
        )
        restarted = wait_while_running(
            "restarted searcher",
            lambda: (pid := guarded_service(up.pid, "searcher-0")) != searcher and pid,
            30,
            up,
            log,
        )
        reaped = re.search(
            r"guard of searcher-0: service exited \(SIGKILL\); killed \d+ processes left in its group: "
            r"(.*)",
            (run_dir / "logs" / "searcher-0.log").read_text(),
        )
        assert reaped is not None
        # The engine's processes were killed; the resource tracker outlived them and unlinked their shared memory.
        assert {int(pid) for pid in re.findall(r"(\d+) \(", reaped.group(1))} == helpers - trackers
        assert [seg for seg in shm if seg.exists()] == [], reaped.group(0)

        # 2. kill -9 of tba up itself: every process of the run ends within the guards' grace period.
        # The running summary follows the restart: it names the new searcher's process group.
        group = os.getpgid(restarted)
        summary = wait_while_running(
            "summary naming the restarted searcher",
            lambda: (s := read_summary(run_dir)) and s["process_groups"].get("searcher-0") == group and s,
            2 * SUMMARY_EVERY_SECONDS,
            up,
            log,
        )
        assert summary["state"] == "running"
        assert set(summary["process_groups"]) == {"redis", "buffer", "trainer", "searcher-0", "searcher-1"}
        assert summary["endpoints"]["redis"].startswith("redis://")
        # redis-server rewrites its command line and environment (its process title): it is found as a descendant.
        run = descendants(up.pid)
        names = [command_line(p) for p in run]
        assert len(run) >= 10 and alive(restarted), "\n".join(names)  # 5 guards, redis, buffer, trainer, 2 searchers
        assert any("redis-server" in name for name in names), names
        shm = shared_memory(run)
        up.kill()
        up.wait(10)
        killed = time.monotonic()
        deadline = killed + GRACE_SECONDS + 5
        while (any(alive(p) for p in run) or running_with(str(run_dir))) and time.monotonic() < deadline:
            time.sleep(0.2)
        left = [command_line(p) for p in run if alive(p)] + running_with(str(run_dir))
        assert left == [], f"{time.monotonic() - killed:.0f} s after kill -9 of tba up: {left}"
        assert [seg for seg in shm if seg.exists()] == []
        # The summary on disk is whole (written by rename), and says the run did not finish.
        assert json.loads((run_dir / "summary.json").read_text())["state"] == "running"
    finally:
        if up.poll() is None:
            up.kill()
            up.wait(10)
