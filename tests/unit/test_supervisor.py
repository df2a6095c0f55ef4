"""tba up's process supervision with real processes: restart on crash, clean stop of the whole group, and
nothing left behind when a child or the supervisor itself is killed with SIGKILL."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tba.local.commands import tba_command
from tba.local.supervisor import Child, Supervisor
from tba.process_tree import alive

# A service that starts a helper in its own process group, as a searcher starts vLLM's engine core. The helper
# ignores SIGTERM: only SIGKILL removes it. Every start appends the service's and the helper's pids to files in
# DIR, and notes in DIR/overlap any helper of an earlier start still alive. A "polite" service exits on SIGTERM
# (noting it in DIR/terminated); a "stubborn" one ignores SIGTERM as well.
SERVICE = """
import os, signal, subprocess, sys, time
from pathlib import Path

from tba.process_tree import alive

d, kind = Path(sys.argv[1]), sys.argv[2]
d.mkdir(parents=True, exist_ok=True)
earlier = (d / "helpers").read_text().split() if (d / "helpers").exists() else []
if any(alive(int(pid)) for pid in earlier):
    (d / "overlap").write_text(" ".join(earlier))


def on_term(signum, frame):
    (d / "terminated").write_text(str(os.getpid()))
    sys.exit(0)


signal.signal(signal.SIGTERM, on_term if kind == "polite" else signal.SIG_IGN)
helper = subprocess.Popen([sys.executable, "-c",
                           "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"])
with (d / "helpers").open("a") as f:
    f.write(f"{helper.pid}\\n")
with (d / "services").open("a") as f:
    f.write(f"{os.getpid()}\\n")
while True:
    time.sleep(1)
"""

# A service whose helper, started the way vLLM starts its engine core (multiprocessing, spawn), creates a
# shared memory segment and names it in DIR/segment.
SHM_SERVICE = """
import multiprocessing, os, sys, time
from multiprocessing import shared_memory
from pathlib import Path


def hold(d):
    segment = shared_memory.SharedMemory(create=True, size=1 << 20)
    (d / "segment").write_text(segment.name)
    time.sleep(600)


if __name__ == "__main__":
    d = Path(sys.argv[1])
    (d / "service").write_text(str(os.getpid()))
    multiprocessing.get_context("spawn").Process(target=hold, args=(d,)).start()
    time.sleep(600)
"""

# A supervisor of its own (what `tba up` runs), to be killed with SIGKILL: a polite and a stubborn service.
SUPERVISOR = """
import os, sys, time
from pathlib import Path

from tba.local.supervisor import Child, Supervisor

d, service = Path(sys.argv[1]), sys.argv[2]
sup = Supervisor()
for kind in ("polite", "stubborn"):
    sup.add(Child(kind, [sys.executable, service, str(d / kind), kind], dict(os.environ), d / f"{kind}.log",
                  grace=1.0))
while True:
    sup.check()
    time.sleep(0.2)
"""


@pytest.fixture
def sup() -> Iterator[Supervisor]:
    """A supervisor whose children are all stopped after the test, whatever it asserted."""
    supervisor = Supervisor()
    yield supervisor
    supervisor.stop_all(timeout=1.0)


def _wait(pred, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.05)
    return False


def _pids(path: Path) -> list[int]:
    return [int(p) for p in path.read_text().split()] if path.exists() else []


def _service(tmp_path: Path, name: str, kind: str) -> Child:
    script = tmp_path / "service.py"
    script.write_text(SERVICE)
    # the service imports tba.process_tree
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    return Child(
        name, [sys.executable, str(script), str(tmp_path / name), kind], env, tmp_path / f"{name}.log", grace=1.0
    )


def test_a_crashing_child_is_reported_and_restarted(tmp_path: Path, sup: Supervisor) -> None:
    sup.max_restarts = 2
    child = sup.add(
        Child("crasher", [sys.executable, "-c", "import sys; sys.exit(3)"], dict(os.environ), tmp_path / "crasher.log")
    )
    assert _wait(lambda: (sup.check(), child.restarts >= 1)[1], timeout=10)
    assert child.exit_codes[0] == 3
    assert any("exited with code 3" in e for e in sup.events)


def test_a_child_placed_on_cpus_runs_there_with_everything_it_starts(tmp_path: Path, sup: Supervisor) -> None:
    """``Child.cpus`` (tba up --trainer-cpus / --searcher-cpus): the service and its own children are confined."""
    cpu = max(os.sched_getaffinity(0))
    code = (
        "import os, subprocess, sys; print(sorted(os.sched_getaffinity(0))); sys.stdout.flush(); "
        "subprocess.run([sys.executable, '-c', 'import os; print(sorted(os.sched_getaffinity(0)))'])"
    )
    sup.add(
        Child(
            "placed", [sys.executable, "-c", code], dict(os.environ), tmp_path / "placed.log", restart=False, cpus=[cpu]
        )
    )
    log = tmp_path / "placed.log"
    assert _wait(lambda: log.exists() and log.read_text().count("[") == 2, timeout=20), log.read_text()
    assert log.read_text().split() == [f"[{cpu}]", f"[{cpu}]"]


def test_a_nicer_child_runs_so_with_everything_it_starts(tmp_path: Path, sup: Supervisor) -> None:
    """``Child.nice`` (tba up --backfill): the service and its own children run at the lower priority, and so
    does their session's scheduling group where the kernel groups sessions (autogroup), or the nice value
    would count only against the service's own processes."""
    code = (
        "import os, subprocess, sys; print(os.nice(0)); sys.stdout.flush(); "
        "subprocess.run([sys.executable, '-c', 'import os; print(os.nice(0))'])"
    )
    sup.add(Child("nicer", [sys.executable, "-c", code], dict(os.environ), tmp_path / "n.log", restart=False, nice=19))
    log = tmp_path / "n.log"
    assert _wait(lambda: log.exists() and len(log.read_text().split()) == 2, timeout=20), log.read_text()
    assert log.read_text().split() == ["19", "19"]
    autogroups = Path("/proc/sys/kernel/sched_autogroup_enabled")
    if autogroups.exists() and autogroups.read_text().strip() == "1":
        code = "import time; print(open('/proc/self/autogroup').read(), flush=True); time.sleep(30)"
        sup.add(Child("group", [sys.executable, "-c", code], dict(os.environ), tmp_path / "g.log", nice=19))
        log = tmp_path / "g.log"
        assert _wait(lambda: log.exists() and "nice" in log.read_text(), timeout=20)
        assert log.read_text().split()[-2:] == ["nice", "19"], log.read_text()


def test_a_bad_cpu_list_is_refused_by_name() -> None:
    bad = subprocess.run(
        [
            sys.executable,
            "-m",
            "tba.local.lifetime",
            "--name",
            "x",
            "--parent",
            str(os.getpid()),
            "--cpus",
            "0-x",
            "--",
            "true",
        ],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert bad.returncode == 2 and "--cpus '0-x'" in bad.stderr and "not a CPU id or range" in bad.stderr
    guard = [sys.executable, "-m", "tba.local.lifetime", "--name", "x", "--parent", str(os.getpid())]
    bad = subprocess.run([*guard, "--nice", "20", "--", "true"], capture_output=True, text=True, timeout=30)
    assert bad.returncode == 2 and "--nice must be in [0, 19], got 20" in bad.stderr
    up = subprocess.run(tba_command("up", "--trainer-cpus", "4096"), capture_output=True, text=True, timeout=60)
    assert up.returncode == 2 and "--trainer-cpus='4096': CPUs [4096] are not among this machine's" in up.stderr


def test_stop_kills_grandchildren_too(tmp_path: Path, sup: Supervisor) -> None:
    """A child that spawns a process of its own (as vLLM does) and ignores SIGTERM leaves nothing behind."""
    child = sup.add(_service(tmp_path, "parent", "stubborn"))
    assert _wait(lambda: _pids(tmp_path / "parent" / "helpers"))
    helper = _pids(tmp_path / "parent" / "helpers")[0]
    sup.stop(["parent"], timeout=1.0)
    assert not child.running
    assert _wait(lambda: not alive(helper), timeout=5)  # gone, or a zombie nobody reaped yet


def test_a_child_killed_with_sigkill_is_restarted_without_its_old_helpers(tmp_path: Path, sup: Supervisor) -> None:
    """kill -9 of a service: its helper dies before the restart, and the restart reports a signal death."""
    child = sup.add(_service(tmp_path, "searcher", "polite"))
    d = tmp_path / "searcher"
    assert _wait(lambda: _pids(d / "services"))
    service, helper = _pids(d / "services")[0], _pids(d / "helpers")[0]
    os.kill(service, signal.SIGKILL)
    assert _wait(lambda: (sup.check(), len(_pids(d / "services")) == 2)[1], timeout=15)
    assert not alive(helper), "the killed service's helper survived its restart"
    assert not (d / "overlap").exists(), "the restarted service ran next to its predecessor's helper"
    assert child.exit_codes == [-signal.SIGKILL]  # the guard dies as its service died
    assert any("restarting searcher" in e for e in sup.events)
    sup.stop_all()
    assert not any(alive(pid) for pid in _pids(d / "services") + _pids(d / "helpers"))


def test_shared_memory_of_a_killed_service_is_released(tmp_path: Path, sup: Supervisor) -> None:
    """A service killed with SIGKILL whose spawned helper holds shared memory (as vLLM's engine core and worker
    hold their message queues): the helper is killed, and the resource tracker left alive long enough to
    unlink the segment, so /dev/shm keeps nothing of it."""
    script = tmp_path / "shm_service.py"
    script.write_text(SHM_SERVICE)
    child = sup.add(
        Child(
            "searcher",
            [sys.executable, str(script), str(tmp_path)],
            dict(os.environ),
            tmp_path / "searcher.log",
            grace=5.0,
        )
    )
    sup.max_restarts = 0
    assert _wait(lambda: (tmp_path / "segment").exists(), timeout=30)
    segment = Path("/dev/shm") / (tmp_path / "segment").read_text()
    assert segment.exists()
    os.kill(int((tmp_path / "service").read_text()), signal.SIGKILL)
    assert _wait(lambda: (sup.check(), child.exit_codes)[1], timeout=15)
    assert not segment.exists(), child.log_path.read_text()
    assert "killed 1 processes left in its group" in child.log_path.read_text()  # the helper; the tracker left


def test_a_killed_guard_leaves_nothing_behind(tmp_path: Path, sup: Supervisor) -> None:
    """kill -9 of the guard itself: its service is told to stop (SIGTERM, parent-death signal), and the
    supervisor kills the rest of the group (the helper ignores SIGTERM) and says so."""
    sup.max_restarts = 0
    child = sup.add(_service(tmp_path, "searcher", "polite"))
    d = tmp_path / "searcher"
    assert _wait(lambda: _pids(d / "services"))
    service, helper = _pids(d / "services")[0], _pids(d / "helpers")[0]
    assert child.proc is not None
    os.kill(child.proc.pid, signal.SIGKILL)
    assert _wait(lambda: (d / "terminated").exists(), timeout=5), "the service never got SIGTERM"
    assert alive(helper), "nothing but the supervisor should have killed the helper yet"
    assert _wait(lambda: (sup.check(), child.exit_codes)[1], timeout=5)
    assert _wait(lambda: not alive(helper) and not alive(service), timeout=5)
    assert any(line.startswith(f"{helper} ") for line in child.reaped), child.reaped
    assert any("processes left in its group" in e for e in sup.events), sup.events


def test_nothing_outlives_a_supervisor_killed_with_sigkill(tmp_path: Path) -> None:
    """kill -9 of the supervisor: the polite service stops on SIGTERM, the stubborn one is killed after the
    grace period, and both helpers go with them."""
    script = tmp_path / "service.py"
    script.write_text(SERVICE)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    parent = subprocess.Popen([sys.executable, "-c", SUPERVISOR, str(tmp_path), str(script)], env=env)
    try:
        assert _wait(lambda: all(_pids(tmp_path / kind / "helpers") for kind in ("polite", "stubborn")), timeout=20)
        pids = [
            pid
            for kind in ("polite", "stubborn")
            for name in ("services", "helpers")
            for pid in _pids(tmp_path / kind / name)
        ]
        parent.kill()
        parent.wait(5)
        started = time.monotonic()
        assert _wait(lambda: not any(alive(pid) for pid in pids), timeout=8), [pid for pid in pids if alive(pid)]
        assert time.monotonic() - started < 5  # the stubborn one: 1 s of grace, then SIGKILL
        assert (tmp_path / "polite" / "terminated").exists(), "the polite service was not asked to stop"
        assert "parent" in (tmp_path / "stubborn.log").read_text()  # the guard says why it stopped its service
    finally:
        if parent.poll() is None:
            parent.kill()
        for kind in ("polite", "stubborn"):  # whatever a failure left behind
            for pid in _pids(tmp_path / kind / "services") + _pids(tmp_path / kind / "helpers"):
                if alive(pid):
                    os.kill(pid, signal.SIGKILL)
