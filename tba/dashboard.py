"""What ``tba up`` shows and records while the system runs.

:class:`Observer` polls the services' own endpoints (buffer ``/v1/stats``,
trainer and searcher ``/status``) and the checkpoint announcements on Redis;
it keeps a timeline for the report. :func:`render` turns one snapshot into the
live console table; :func:`one_line` is the same for logs and CI.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from rich.table import Table


@dataclass
class Snapshot:
    t: float
    trainer: dict[str, Any] = field(default_factory=dict)
    buffer: dict[str, Any] = field(default_factory=dict)
    searchers: dict[str, dict[str, Any]] = field(default_factory=dict)
    accuracy: float | None = None
    accuracy_version: int | None = None


class Observer:
    """Polls every service and keeps what the console and the report need."""

    def __init__(self, buffer_url: str, token: str | None, status_urls: dict[str, str], timeline: Path) -> None:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.http = httpx.Client(timeout=1.0, headers=headers)
        self.buffer_url = buffer_url
        self.status_urls = status_urls  # name -> http://host:port of its health server
        self.timeline_path = timeline
        self.t0 = time.time()
        self.versions_published: list[tuple[float, int]] = []
        self.accuracy: float | None = None
        self.accuracy_version: int | None = None
        self._lock = threading.Lock()

    def _get(self, url: str) -> dict[str, Any]:
        try:
            r = self.http.get(url)
            return r.json() if r.status_code == 200 else {"error": f"HTTP {r.status_code}"}
        except (httpx.HTTPError, ValueError) as err:
            return {"error": type(err).__name__}

    def poll(self) -> Snapshot:
        snap = Snapshot(t=time.time() - self.t0)
        snap.buffer = self._get(f"{self.buffer_url}/v1/stats")
        for name, url in self.status_urls.items():
            status = self._get(f"{url}/status")
            if name == "trainer":
                snap.trainer = status
            else:
                snap.searchers[name] = status
        with self._lock:
            snap.accuracy, snap.accuracy_version = self.accuracy, self.accuracy_version
        with self.timeline_path.open("a") as f:
            f.write(json.dumps({"t": snap.t, "trainer": snap.trainer, "buffer": _buffer_brief(snap.buffer),
                                "searchers": snap.searchers}, default=str) + "\n")
        return snap

    def record_version(self, version: int) -> None:
        with self._lock:
            if not self.versions_published or self.versions_published[-1][1] != version:
                self.versions_published.append((time.time() - self.t0, version))

    def record_accuracy(self, version: int, accuracy: float) -> None:
        with self._lock:
            self.accuracy, self.accuracy_version = accuracy, version

    def close(self) -> None:
        self.http.close()


def _buffer_brief(stats: dict[str, Any]) -> dict[str, Any]:
    keys = ("prompts", "samples", "reward_mean", "samples_ingested", "groups_ingested", "dead_letters")
    return {k: stats.get(k) for k in keys}


def _fmt(value: Any, spec: str = "") -> str:
    if value is None or value == "":
        return "-"
    try:
        return format(value, spec)
    except (TypeError, ValueError):
        return str(value)


def render(snap: Snapshot, events: list[str]) -> Table:
    """The live console: one row per service, then the last events."""
    tr, bf = snap.trainer, snap.buffer
    table = Table(title=f"TBA  ·  {snap.t:6.0f} s", expand=False)
    for col in ("service", "state", "version", "detail"):
        table.add_column(col)
    acc = f"held-out acc {_fmt(snap.accuracy, '.1%')} (v{_fmt(snap.accuracy_version)})"
    table.add_row(
        "trainer", _fmt(tr.get("state", tr.get("error"))), _fmt(tr.get("version")),
        f"step {_fmt(tr.get('step'))}  reward {_fmt(tr.get('reward_mean'), '.3f')}  loss {_fmt(tr.get('loss'), '.3f')}"
        f"  stale {_fmt(tr.get('staleness_mean'), '.1f')}  {_fmt(tr.get('tokens_per_s'), '.0f')} tok/s  {acc}",
    )
    table.add_row(
        "buffer", "error" if "error" in bf else "ok", "",
        f"{_fmt(bf.get('samples'))} samples / {_fmt(bf.get('prompts'))} prompts"
        f"  reward {_fmt(bf.get('reward_mean'), '.3f')}"
        f"  dead letters {_fmt(bf.get('dead_letters', bf.get('samples_dead_lettered')))}",
    )
    for name, st in sorted(snap.searchers.items()):
        table.add_row(
            name, _fmt(st.get("state", st.get("error"))), _fmt(st.get("version")),
            f"{_fmt(st.get('samples_per_s'), '.1f')} samples/s  {_fmt(st.get('tokens_per_s'), '.0f')} tok/s"
            f"  groups {_fmt(st.get('groups_published'))}  reload {_fmt(st.get('reload_ms_last'), '.0f')} ms",
        )
    for event in events[-3:]:
        table.add_row("event", "", "", event)
    return table


def one_line(snap: Snapshot) -> str:
    tr, bf = snap.trainer, snap.buffer
    versions = ",".join(f"{n}=v{_fmt(s.get('version'))}" for n, s in sorted(snap.searchers.items()))
    return (
        f"[{snap.t:5.0f}s] trainer step {_fmt(tr.get('step'))} v{_fmt(tr.get('version'))}"
        f" reward {_fmt(tr.get('reward_mean'), '.3f')} | buffer {_fmt(bf.get('samples'))} samples"
        f" | acc {_fmt(snap.accuracy, '.1%')} | {versions}"
    )
