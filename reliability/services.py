"""The real processes a reliability run works against: a redis-server and a `tba buffer`.

Both start the way ``tba up`` starts them (Redis with AOF, ``appendfsync everysec`` and
``noeviction``; the buffer as ``python -m tba.cli buffer`` configured by ``TBA_*`` variables), each
on a free port with its own data directory and log, so a run shares nothing with anything else
on the machine. The test suite starts Redis with its own fixture and hands the URL in; the
buffer is always started here, so that the suites measure exactly the process a deployment runs.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import httpx

from tba.health import free_port
from tba.local.commands import tba_command
from tba.redis_client import server_args

ROOT = Path(__file__).resolve().parent.parent


class RedisProcess:
    """A redis-server of the run's own, with the persistence flags ``tba up`` uses."""

    def __init__(self, data_dir: Path, password: str | None = None) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError("redis-server is not installed: `apt-get install -y redis-server` (make install does)")
        self.binary = binary
        self.data_dir = data_dir.resolve()  # redis-server enters --dir first: a relative --logfile would miss
        self.password = password
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return self.url_with(self.password)

    @property
    def url_without_password(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def url_with(self, password: str | None) -> str:
        return f"redis://:{password}@127.0.0.1:{self.port}/0" if password else self.url_without_password

    def start(self) -> RedisProcess:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        # The password, if any, reaches redis-server as configuration on its stdin ("-"): never on a command line.
        self.proc = subprocess.Popen(
            [
                self.binary,
                "-",
                *server_args(self.port, self.data_dir),
                "--daemonize",
                "no",
                "--logfile",
                str(self.data_dir / "redis.log"),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        assert self.proc.stdin is not None
        self.proc.stdin.write(f"requirepass {self.password}\n".encode() if self.password else b"")
        self.proc.stdin.close()
        hello = f"AUTH {self.password}\r\nPING\r\n".encode() if self.password else b"PING\r\n"
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2) as s:
                    s.sendall(hello)
                    if s.recv(32).endswith(b"+PONG\r\n"):
                        return self
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"redis-server did not start on port {self.port}; see {self.data_dir / 'redis.log'}")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)
        self.proc = None


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


def cpu_seconds(pid: int) -> float:
    """User + system CPU time ``pid`` has used so far (fields 14 and 15 of /proc/<pid>/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_bytes(pid: int) -> int:
    """Resident set size of ``pid`` (``VmRSS`` of /proc/<pid>/status), in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"/proc/{pid}/status has no VmRSS (a zombie?)")
