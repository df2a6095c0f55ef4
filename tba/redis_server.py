"""A redis-server of our own: how the project runs one, starts it, waits for it and stops it.

Every Redis the project starts itself is this one server: on loopback, on a free port, its files in a
directory of its own, with the persistence settings of :func:`server_args`. ``tba up`` runs it under its
supervisor, which restarts it and stops it with the run, from :func:`server_command`; the tests, the benchmarks
and the reliability suites start a :class:`RedisServer`, which dies with the process that started it.

A password never appears on a command line (``ps`` shows those to every user): redis-server reads it from
a configuration file given before the arguments, which :func:`password_config` writes, or from its stdin.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from urllib.parse import quote

import redis

from tba.health import free_port
from tba.procs import die_with_parent
from tba.redis_client import sync_client

HOST = "127.0.0.1"
START_TIMEOUT_SECONDS = 10.0  # an empty server answers in about 20 ms; reopening a large AOF takes longer
STOP_TIMEOUT_SECONDS = 10.0  # SIGTERM makes redis-server fsync its AOF and exit; past this it is killed


class RedisServerError(RuntimeError):
    """redis-server is missing, or did not start: the message says what to do or where its log is."""


def server_binary() -> str:
    """The redis-server on PATH; a clear error naming the package where there is none."""
    binary = shutil.which("redis-server")
    if binary is None:
        raise RedisServerError(
            "redis-server is not installed: `apt-get install -y redis-server` (make install does it)"
        )
    return binary


def server_args(port: int, data_dir: str | Path, appendonly: bool = True) -> list[str]:
    """redis-server's arguments as the project runs it: on loopback, in the foreground, its files in
    ``data_dir``, the append-only file fsynced every second (a kill -9 loses at most a second of writes;
    ``appendonly=False`` for throwaway servers), no RDB snapshots, and writes refused rather than keys
    evicted when memory is full (the buffer enforces its own capacity; silently evicted keys would corrupt
    its indexes)."""
    return [
        "--port",
        str(port),
        "--bind",
        HOST,
        "--dir",
        str(data_dir),
        "--daemonize",
        "no",
        "--save",
        "",
        "--appendonly",
        "yes" if appendonly else "no",
        "--appendfsync",
        "everysec",
        "--maxmemory-policy",
        "noeviction",
    ]


def server_command(
    port: int,
    data_dir: str | Path,
    appendonly: bool = True,
    config: str | Path | None = None,
    extra: Sequence[str] = (),
) -> list[str]:
    """redis-server's whole command line. ``config``: a configuration file it reads before the arguments
    (``"-"``: its stdin), where a password goes. ``data_dir`` is made absolute: redis-server enters it
    before it opens anything, so a relative path given after it (a log file) would miss."""
    data_dir = Path(data_dir).resolve()
    return [server_binary(), *([str(config)] if config else []), *server_args(port, data_dir, appendonly), *extra]


def server_url(port: int, password: str | None = None) -> str:
    """The URL of the server on ``port``, with ``password`` if given (quoted: the client unquotes it)."""
    if not password:
        return f"redis://{HOST}:{port}/0"
    return f"redis://:{quote(password, safe='')}@{HOST}:{port}/0"


def password_config(password: str) -> str:
    """The configuration line that makes redis-server require ``password``, quoted so that any password
    (spaces, quotes, backslashes included) is read back as given."""
    if not password:
        raise ValueError("a Redis password cannot be empty")
    quoted = password.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("\r", "\\r")
    return f'requirepass "{quoted}"\n'


def cluster_args(data_dir: Path, bus_port: int) -> list[str]:
    """The arguments that make a server a Redis Cluster node: its cluster bus on ``bus_port`` (not the
    default port + 10000, which nothing reserved), its cluster state in ``data_dir``, a short node timeout."""
    return [
        "--cluster-enabled",
        "yes",
        "--cluster-config-file",
        str(data_dir / "nodes.conf"),
        "--cluster-port",
        str(bus_port),
        "--cluster-node-timeout",
        "2000",
    ]


class RedisServer:
    """A redis-server of the caller's own, on a free port with its own data directory; its log is
    ``redis.log`` there. ``stop()`` and ``start()`` again reopen the same port and files (what survives a
    kill is what reached the AOF). It gets SIGKILL when the process that started it dies, however that
    ends, so a killed test or benchmark leaves no server behind. Start it from a thread that lives as long
    as its process (the main thread): the kernel's signal follows the thread that forked it."""

    def __init__(
        self,
        data_dir: str | Path,
        password: str | None = None,
        appendonly: bool = True,
        cluster: bool = False,
    ) -> None:
        self.data_dir = Path(data_dir).resolve()
        self.password = password
        self.appendonly = appendonly
        self.port = free_port()
        self._extra = cluster_args(self.data_dir, free_port()) if cluster else []
        self.proc: subprocess.Popen[bytes] | None = None
        self.config = password_config(password) if password is not None else ""

    @property
    def url(self) -> str:
        """The URL a client uses, with the password if there is one."""
        return self.url_with(self.password)

    @property
    def url_without_password(self) -> str:
        return self.url_with(None)

    def url_with(self, password: str | None) -> str:
        """This server's URL with ``password`` (a wrong one, or none, to test what it refuses)."""
        return server_url(self.port, password)

    @property
    def log(self) -> Path:
        return self.data_dir / "redis.log"

    @property
    def pid(self) -> int:
        if self.proc is None:
            raise RedisServerError("the redis-server is not running")
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self, timeout: float = START_TIMEOUT_SECONDS) -> RedisServer:
        """Start the server and return once it answers; stopped again, with its log's tail in the error, if it
        exits or does not answer within ``timeout`` seconds."""
        if self.alive():
            raise RedisServerError(f"the redis-server on port {self.port} is already running")
        self.data_dir.mkdir(parents=True, exist_ok=True)
        argv = server_command(
            self.port,
            self.data_dir,
            self.appendonly,
            config="-" if self.config else None,  # the password on its stdin, not in argv
            extra=[*self._extra, "--logfile", str(self.log)],
        )
        self.proc = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE if self.config else subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            preexec_fn=die_with_parent,
        )
        if self.proc.stdin is not None:
            self.proc.stdin.write(self.config.encode())
            self.proc.stdin.close()
        try:
            self._wait_until_it_answers(timeout)
        except RedisServerError:
            self.stop(kill=True)
            raise
        return self

    def _wait_until_it_answers(self, timeout: float) -> None:
        client = sync_client(self.url, timeout=0.5, retry=False)
        deadline = time.monotonic() + timeout
        try:
            while True:
                assert self.proc is not None
                if self.proc.poll() is not None:
                    raise RedisServerError(
                        f"redis-server exited with {self.proc.returncode} before answering on port {self.port}; "
                        f"{self._log_tail()}"
                    )
                try:
                    # PING: answered once the AOF is loaded. The server answering must be this one, not another
                    # that took the port first (this one then fails to bind and exits).
                    if client.ping() and int(client.info("server")["process_id"]) == self.proc.pid:
                        return
                except (redis.ConnectionError, redis.TimeoutError):
                    pass  # not listening yet, or still loading its AOF
                if time.monotonic() > deadline:
                    raise RedisServerError(
                        f"redis-server did not answer on port {self.port} within {timeout:g} s; {self._log_tail()}"
                    )
                time.sleep(0.02)
        finally:
            client.close()

    def _log_tail(self, chars: int = 2000) -> str:
        if not self.log.exists():
            return f"it wrote no log ({self.log})"
        return f"the end of its log ({self.log}):\n{self.log.read_text(errors='replace')[-chars:]}"

    def stop(self, kill: bool = False, timeout: float = STOP_TIMEOUT_SECONDS) -> None:
        """SIGTERM (the server fsyncs its AOF and exits), SIGKILL if it has not exited within ``timeout``
        seconds; ``kill=True``: SIGKILL at once, a crash (only what reached the AOF survives)."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            if kill:
                self.proc.kill()
            else:
                self.proc.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def client(self) -> redis.Redis:
        """A client of this server (one node's, for a cluster node)."""
        client = sync_client(self.url)
        assert isinstance(client, redis.Redis)
        return client

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.stop()
