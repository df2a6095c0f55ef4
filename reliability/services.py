"""The `tba buffer` a reliability run works against, started the way ``tba up`` starts it.

The buffer runs as ``python -m tba.cli buffer`` configured by ``TBA_*`` variables, on a free port with its
own log, so a run shares nothing with anything else on the machine and the suites measure exactly the
process a deployment runs. Its Redis is a :class:`tba.redis_server.RedisServer` (AOF on, as in ``tba up``).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

from tba.health import free_port
from tba.local.commands import tba_command
from tba.procs import die_with_parent
from tba.redis_server import RedisServer

ROOT = Path(__file__).resolve().parent.parent


@contextmanager
def suite_redis(workdir: Path, url: str | None = None) -> Iterator[str]:
    """The URL of the Redis a suite works against: ``url``, an empty Redis of the caller's, if given; else a
    redis-server of the run's own in a new directory under ``workdir``, stopped on leaving, its AOF removed
    then (hundreds of MB after a soak) and its log kept."""
    if url:
        yield url
        return
    data_dir = Path(tempfile.mkdtemp(prefix="redis-", dir=workdir))
    try:
        with RedisServer(data_dir) as server:
            yield server.url
    finally:
        shutil.rmtree(data_dir / "appendonlydir", ignore_errors=True)


class BufferProcess:
    """``tba buffer`` as a process of its own, configured by ``settings`` (BufferSettings names, lower case)."""

    def __init__(self, redis_url: str, log: Path, token: str, **settings: object) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.token = token
        self.log = log
        self.env = {
            **os.environ,
            "TBA_REDIS_URL": redis_url,
            "TBA_PORT": str(self.port),
            "TBA_AUTH_TOKEN": token,
            "TBA_LOG_LEVEL": "WARNING",
            **{f"TBA_{name.upper()}": str(value) for name, value in settings.items()},
        }
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int:
        assert self.proc is not None, "the buffer is not running"
        return self.proc.pid

    @property
    def headers(self) -> dict[str, str]:
        """What an authorised caller sends."""
        return {"Authorization": f"Bearer {self.token}"}

    def launch(self) -> BufferProcess:
        """The process, without waiting for it to be ready (a buffer that cannot reach Redis never is)."""
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                tba_command("buffer"),
                cwd=ROOT,
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
                preexec_fn=lambda: die_with_parent(signal.SIGTERM),  # a killed suite leaves no buffer behind
            )
        return self

    def start(self, timeout: float = 60.0) -> BufferProcess:
        self.launch()
        assert self.proc is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the buffer exited with {self.proc.returncode}:\n{self.log_tail()}")
            if self.ready():
                return self
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"the buffer did not become ready in {timeout:.0f} s:\n{self.log_tail()}")

    def ready(self) -> bool:
        try:
            return httpx.get(f"{self.url}/readyz", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self) -> bool:
        """SIGTERM, as an orchestrator stops it: True if it was running and shut down by itself in time
        (uvicorn exits by the signal once it has shut down gracefully), False if it had to be killed."""
        if self.proc is None:
            return False
        graceful = self.proc.poll() is None
        if graceful:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                graceful = False
                self.proc.kill()
                self.proc.wait(10)
        self.proc = None
        return graceful

    def log_tail(self, chars: int = 4000) -> str:
        return self.log.read_text(errors="replace")[-chars:] if self.log.exists() else ""
