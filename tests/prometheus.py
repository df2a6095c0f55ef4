"""A real Prometheus server of a test's own (Debian's ``prometheus`` package), scraping given targets.

Started under the project's lifetime guard (tba/local/lifetime.py), so it dies with the test process
however that ends.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tba.health import free_port

SCRAPE_SECONDS = 1


def dashboard_expressions(dashboard: dict[str, Any], rate_interval: str = "30s") -> list[tuple[str, str]]:
    """(panel title, PromQL) of every query of a Grafana dashboard, Grafana's ``$__rate_interval`` filled in."""
    out = []
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            out.append((panel["title"], target["expr"].replace("$__rate_interval", rate_interval)))
    return out


def metric_names(expr: str) -> set[str]:
    """The series names a PromQL expression reads (this project's: they all start with ``tba_``)."""
    return set(re.findall(r"\btba_[a-z0-9_]+", expr))


class Prometheus:
    def __init__(self, data_dir: Path, targets: dict[str, list[str]]) -> None:
        binary = shutil.which("prometheus")
        if binary is None:
            pytest.fail("prometheus is not installed: `apt-get install -y prometheus` (make test does it)")
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        data_dir.mkdir(parents=True, exist_ok=True)
        config = {
            "global": {"scrape_interval": f"{SCRAPE_SECONDS}s", "scrape_timeout": f"{SCRAPE_SECONDS}s"},
            "scrape_configs": [
                {"job_name": job, "static_configs": [{"targets": hosts}]} for job, hosts in targets.items()
            ],
        }
        (data_dir / "prometheus.yml").write_text(yaml.safe_dump(config))
        cmd = [
            binary,
            f"--config.file={data_dir / 'prometheus.yml'}",
            f"--storage.tsdb.path={data_dir / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{self.port}",
        ]
        guard = [
            sys.executable,
            "-m",
            "tba.local.lifetime",
            "--name",
            "prometheus",
            "--parent",
            str(os.getpid()),
            "--",
            *cmd,
        ]
        self.log = (data_dir / "prometheus.log").open("w")
        self.proc = subprocess.Popen(guard, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{self.url}/-/ready", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if self.proc.poll() is not None:
                break
            time.sleep(0.2)
        self.stop()
        pytest.fail(f"prometheus did not start; see {data_dir / 'prometheus.log'}")

    def api(self, path: str, **params: Any) -> Any:
        r = httpx.get(f"{self.url}/api/v1/{path}", params=params, timeout=10)
        body = r.json()
        assert body.get("status") == "success", f"{path} {params}: {body}"
        return body["data"]

    def series(self, name: str) -> list[dict[str, str]]:
        return self.api("series", **{"match[]": name})

    def query_range(self, expr: str, start: float, end: float) -> list[dict[str, Any]]:
        return self.api("query_range", query=expr, start=start, end=end, step=SCRAPE_SECONDS)["result"]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
