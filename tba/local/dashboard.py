"""What ``tba up`` shows and records while the system runs.

:class:`Observer` polls the services' own endpoints (buffer ``/v1/stats``, trainer and searcher
``/status``) and the checkpoint announcements on Redis; it derives rates from consecutive polls and
keeps a timeline for the report. :func:`render` turns one snapshot into the live console, a panel
per part of the system; :func:`one_line` is the same for logs and CI (stdout not a terminal).
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import httpx
from rich.console import Group
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from tba.local.cpu_usage import read_cpu_times
from tba.local.report import trained_line
from tba.schemas import SearcherState

SPARK = "▁▂▃▄▅▆▇█"


@dataclass
class Snapshot:
    t: float
    trainer: dict[str, Any] = field(default_factory=dict)
    buffer: dict[str, Any] = field(default_factory=dict)
    searchers: dict[str, dict[str, Any]] = field(default_factory=dict)
    accuracy: list[tuple[int, float]] = field(default_factory=list)  # (version, held-out accuracy), oldest first
    rates: dict[str, float] = field(default_factory=dict)  # per second, from this poll and the previous one


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
        self.accuracy: list[tuple[int, float]] = []
        self.previous: Snapshot | None = None
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
            snap.accuracy = list(self.accuracy)
        snap.rates = rates(self.previous, snap)
        self.previous = snap
        with self.timeline_path.open("a") as f:
            f.write(
                json.dumps(
                    {
                        "t": snap.t,
                        "trainer": snap.trainer,
                        "buffer": _buffer_brief(snap.buffer),
                        "searchers": snap.searchers,
                        "cpus": read_cpu_times(),
                    },
                    default=str,
                )
                + "\n"
            )
        return snap

    def record_version(self, version: int) -> None:
        with self._lock:
            if not self.versions_published or self.versions_published[-1][1] != version:
                self.versions_published.append((time.time() - self.t0, version))

    def record_accuracy(self, version: int, accuracy: float) -> None:
        with self._lock:
            self.accuracy.append((version, accuracy))

    def close(self) -> None:
        self.http.close()


def _buffer_brief(stats: dict[str, Any]) -> dict[str, Any]:
    keys = (
        "prompts",
        "samples",
        "reward_mean",
        "samples_ingested",
        "samples_duplicate",
        "samples_stored_total",
        "samples_served_distinct",
        "groups_ingested",
        "dead_letters",
    )
    return {k: stats.get(k) for k in keys}


def rates(before: Snapshot | None, now: Snapshot) -> dict[str, float]:
    """Trainer steps and buffer ingest per second between two polls (absent where a poll missed a value)."""
    if before is None or now.t <= before.t:
        return {}
    dt = now.t - before.t
    out = {}
    for name, part, key in (("steps_per_s", "trainer", "step"), ("ingest_per_s", "buffer", "samples_ingested")):
        a, b = getattr(before, part).get(key), getattr(now, part).get(key)
        if isinstance(a, int | float) and isinstance(b, int | float) and b >= a:
            out[name] = (b - a) / dt
    return out


def sparkline(values: list[float], width: int = 24, low: float = 0.0, high: float = 1.0) -> str:
    """The last ``width`` values as block characters between ``low`` and ``high``."""
    span = max(high - low, 1e-12)
    out = []
    for v in values[-width:]:
        level = min(max((v - low) / span, 0.0), 1.0)
        out.append(SPARK[round(level * (len(SPARK) - 1))])
    return "".join(out)


def _fmt(value: Any, spec: str = "") -> str:
    if value is None or value == "":
        return "-"
    try:
        return format(value, spec)
    except (TypeError, ValueError):
        return str(value)


SEARCHER_STYLES: dict[str, str] = {  # StrEnum members are their strings
    SearcherState.RUNNING: "green",
    SearcherState.LOADING: "yellow",
    SearcherState.STARTING: "yellow",
    SearcherState.RELOADING: "yellow",
    SearcherState.PAUSED_SPILL_FULL: "yellow",
    SearcherState.PAUSED_FOR_POLICY: "yellow",
    SearcherState.PAUSED_FOR_TRAINER: "yellow",
    SearcherState.STOPPING: "blue",
    SearcherState.STOPPED: "blue",
}
TRAINER_STYLES = {"training": "green", "warmup": "yellow", "waiting": "yellow", "done": "blue"}
# A searcher's warning (its /status ``warning_kind``), as its row's state says it.
WARNINGS = {"lagging": "lagging", "reload_hung": "reload hung"}


def _state(status: dict[str, Any]) -> Text:
    """A service's state, coloured: green working, yellow on its way or held up, blue ending, red anything else
    (an error, an unknown state)."""
    state = str(status.get("state", status.get("error", "-")))
    return Text(state, style=TRAINER_STYLES.get(state) or SEARCHER_STYLES.get(state, "red"))  # str == StrEnum


def _fields(rows: list[tuple[str, str]]) -> Table:
    """A two-column table of name / value: a panel's body."""
    table = Table.grid(padding=(0, 1))
    table.add_column(style="dim")
    table.add_column()
    for name, value in rows:
        table.add_row(name, value)
    return table


def _busy(split: dict[str, Any]) -> str:
    """The trainer's busy fraction and its largest parts, e.g. "97%  backward 44%, forward 21%"."""
    wall, seconds = split.get("wall_s"), split.get("seconds") or {}
    if not wall or split.get("busy_fraction") is None:
        return "-"
    top = sorted(((v, k) for k, v in seconds.items() if k != "other"), reverse=True)[:2]
    return f"{split['busy_fraction']:.0%}  " + ", ".join(f"{k} {v / wall:.0%}" for v, k in top)


def _trainer_panel(snap: Snapshot) -> Panel:
    tr = snap.trainer
    body = _fields(
        [
            (
                "step",
                f"{_fmt(tr.get('step'))}  v{_fmt(tr.get('version'))}  {_fmt(snap.rates.get('steps_per_s'), '.1f')}"
                " steps/s",
            ),
            ("loss", _fmt(tr.get("loss"), ".4g")),
            ("reward", _fmt(tr.get("reward_mean"), ".3f")),
            ("KL", _fmt(tr.get("kl"), ".3g")),
            ("lr", _fmt(tr.get("lr"), ".2e")),
            ("staleness", f"{_fmt(tr.get('staleness_mean'), '.1f')} versions"),
            ("reuse", f"{_fmt(tr.get('reuse'), '.2f')} per sample generated"),
            (
                "wait",
                f"{_fmt(tr.get('wait_s'), '.2f')} s" + (f"  for {tr['waiting_for']}" if tr.get("waiting_for") else ""),
            ),
            ("busy", _busy(tr.get("time") or {})),
        ]
    )
    return Panel(body, title=Text.assemble("trainer  ", _state(tr)), title_align="left")


def _buffer_panel(snap: Snapshot) -> Panel:
    bf = snap.buffer
    ingested, duplicates = bf.get("samples_ingested"), bf.get("samples_duplicate")
    dup = duplicates / ingested if isinstance(ingested, int) and ingested and isinstance(duplicates, int) else None
    body = _fields(
        [
            ("samples", f"{_fmt(bf.get('samples'))} in {_fmt(bf.get('prompts'))} prompts"),
            ("ingest", f"{_fmt(snap.rates.get('ingest_per_s'), '.1f')} samples/s"),
            ("duplicates", _fmt(dup, ".0%")),
            ("trained", trained_line(bf)),
            ("reward", _fmt(bf.get("reward_mean"), ".3f")),
            ("dead letters", _fmt(bf.get("dead_letters", bf.get("samples_dead_lettered")))),
        ]
    )
    state = Text("error", style="red") if "error" in bf else Text("ok", style="green")
    return Panel(body, title=Text.assemble("buffer  ", state), title_align="left")


def _searchers_panel(snap: Snapshot) -> Panel:
    table = Table(box=None, padding=(0, 1), show_edge=False)
    columns: tuple[tuple[str, Literal["left", "right"]], ...] = (
        ("searcher", "left"),
        ("state", "left"),
        ("version", "right"),
        ("lag", "right"),
        ("samples/s", "right"),
        ("reload", "right"),
    )
    for col, justify in columns:
        table.add_column(col, justify=justify, style="dim" if col == "searcher" else None)
    trainer_version = snap.trainer.get("version")
    for name, st in sorted(snap.searchers.items()):
        version = st.get("version")
        lag = trainer_version - version if isinstance(trainer_version, int) and isinstance(version, int) else None
        reload_ms = st.get("reload_ms_last")
        warning = st.get("warning_kind")
        over = bool(st.get("lag_over_bound_s"))  # more than the staleness bound behind, not yet for long
        table.add_row(
            name,
            Text(WARNINGS[warning], style="bold red") if warning in WARNINGS else _state(st),
            _fmt(version),
            Text(_fmt(lag), style="yellow" if over else ""),
            _fmt(st.get("samples_per_s"), ".1f"),
            "-" if reload_ms is None else f"{reload_ms:.0f} ms",
            style="yellow" if warning else None,  # the whole row: this searcher does not keep up
        )
    return Panel(table, title="searchers", title_align="left")


def _accuracy_panel(snap: Snapshot) -> Panel:
    if not snap.accuracy:
        return Panel(
            Text("waiting for the first evaluation", style="dim"), title="held-out accuracy", title_align="left"
        )
    (v0, first), (v, last) = snap.accuracy[0], snap.accuracy[-1]
    best = max(a for _, a in snap.accuracy)
    body = _fields(
        [
            ("now", f"{last:.1%} at v{v}  (start {first:.1%} at v{v0}, best {best:.1%})"),
            ("trend", sparkline([a for _, a in snap.accuracy])),
        ]
    )
    return Panel(body, title="held-out accuracy", title_align="left")


def render(snap: Snapshot, events: list[str], budget_s: float | None = None, title: str = "TBA") -> Group:
    """The live console: a header, a panel per part of the system, then restarts and warnings."""
    remaining = f"  ·  {max(0.0, budget_s - snap.t):.0f} s left" if budget_s is not None else ""
    header = Text.assemble((title, "bold"), f"  ·  {snap.t:.0f} s elapsed{remaining}")
    grid = Table.grid(expand=True, padding=(0, 1))
    grid.add_column(ratio=1)
    grid.add_column(ratio=1)
    grid.add_row(_trainer_panel(snap), _buffer_panel(snap))
    parts: list[Any] = [header, grid, _searchers_panel(snap), _accuracy_panel(snap)]
    if events:
        parts.append(
            Panel(
                Text("\n".join(events[-4:]), style="yellow"),
                title=f"restarts and warnings ({len(events)})",
                title_align="left",
            )
        )
    return Group(*parts)


def one_line(snap: Snapshot) -> str:
    """One progress line for a log (stdout not a terminal)."""
    tr, bf = snap.trainer, snap.buffer
    versions = ",".join(
        f"{n}=v{_fmt(s.get('version'))}"
        + (f" ({WARNINGS[s['warning_kind']]}!)" if s.get("warning_kind") in WARNINGS else "")
        for n, s in sorted(snap.searchers.items())
    )
    acc = snap.accuracy[-1][1] if snap.accuracy else None
    return (
        f"[{snap.t:5.0f}s] trainer step {_fmt(tr.get('step'))} v{_fmt(tr.get('version'))}"
        f" reward {_fmt(tr.get('reward_mean'), '.3f')} | buffer {_fmt(bf.get('samples'))} samples"
        f" | acc {_fmt(acc, '.1%')} | {versions}"
    )
