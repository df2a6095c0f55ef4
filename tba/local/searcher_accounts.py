"""What each searcher of a local run did and what it was worth, from what the run recorded.

- **Warning spans**: the stretches a searcher reported that it did not keep up (``warning_kind`` in its
  ``/status``: ``lagging``, more than ``TBA_MAX_STALENESS`` behind for longer than ``TBA_LAG_SECONDS``, or
  ``reload_hung``), each from when the condition began (the searcher says how long it has held) to the first
  poll without it. The report lists them under events.
- **Accounts**: per searcher, the samples it generated (its own count, summed over restarts), stored (those
  it added to the buffer: the buffer's ``searcher_samples``; a completion another searcher had stored is a
  duplicate), trained on (the trainer's ``samples_by_searcher`` per step: draws, so a sample drawn twice counts
  twice, and the ratio to generated is the searcher's own reuse), too stale to train on (generated more than the
  bound behind the newest version announced), and the version lag of what it generated (mean, max).

Everything is computed from the timeline ``tba up`` polls (``timeline.jsonl``), the trainer's metrics file and
the buffer's final stats, so the running summary and the final one agree.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any

WARNING_NAMES = {"lagging": "lagging", "reload_hung": "reload hung"}


@dataclass
class WarningSpan:
    searcher: str
    kind: str  # "lagging" or "reload_hung"
    start: float  # seconds into the run
    end: float | None  # None: still so at the last poll
    reason: str  # the searcher's /readyz reason, as last polled
    max_lag: int  # the largest version lag seen during the span

    def as_event(self, run_end: float) -> str:
        end = run_end if self.end is None else self.end
        until = "the end of the run" if self.end is None else f"{end:.0f} s"
        return (
            f"{self.searcher} {WARNING_NAMES.get(self.kind, self.kind)} from {self.start:.0f} s to {until} "
            f"({end - self.start:.0f} s, up to {self.max_lag} versions behind): {self.reason}"
        )


def warning_spans(timeline: Iterable[dict[str, Any]]) -> list[WarningSpan]:
    """Every stretch a searcher reported a warning, oldest first, from the polled statuses."""
    spans: list[WarningSpan] = []
    open_: dict[str, WarningSpan] = {}
    for row in timeline:
        t = float(row.get("t", 0.0))
        for name, st in (row.get("searchers") or {}).items():
            kind = st.get("warning_kind")
            span = open_.get(name)
            if span is not None and span.kind != kind:
                span.end = t
                del open_[name]
                span = None
            if kind is None:
                continue
            lag = int(st.get("version_lag") or 0)
            if span is None:
                held = float(st.get("warning_seconds") or 0.0)
                span = open_[name] = WarningSpan(name, kind, max(0.0, t - held), None, str(st.get("warning")), lag)
                spans.append(span)
            span.reason, span.max_lag = str(st.get("warning")), max(span.max_lag, lag)
    return spans


def _lives(timeline: Iterable[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    """The last status of each life of searcher ``name`` (a restarted one counts from 0 again)."""
    lives: list[dict[str, Any]] = []
    for row in timeline:
        st = (row.get("searchers") or {}).get(name) or {}
        n = st.get("samples_generated")
        if not isinstance(n, int):
            continue
        if lives and n < lives[-1]["samples_generated"]:
            lives.append(st)
        elif lives:
            lives[-1] = st
        else:
            lives.append(st)
    return lives


def searcher_accounts(
    timeline: list[dict[str, Any]], steps: list[dict[str, Any]], buffer: dict[str, Any]
) -> dict[str, dict[str, Any]]:
    """Per searcher: samples generated, stored, trained on (and per sample generated), too stale to train on,
    the version lag of what it generated (mean, max), and the first and last version it served."""
    names = sorted({n for row in timeline for n in (row.get("searchers") or {})})
    stored = buffer.get("searcher_samples") or {}
    trained: dict[str, int] = {}
    for step in steps:
        for name, n in (step.get("samples_by_searcher") or {}).items():
            trained[name] = trained.get(name, 0) + int(n)
    out: dict[str, dict[str, Any]] = {}
    for name in names:
        lives = _lives(timeline, name)
        generated = sum(int(st.get("samples_generated") or 0) for st in lives)
        weighted = [(st.get("version_lag_mean"), int(st.get("samples_generated") or 0)) for st in lives]
        lag_sum = sum(m * n for m, n in weighted if isinstance(m, int | float))
        polled = [(row.get("searchers") or {}).get(name) or {} for row in timeline]
        versions = [st["version"] for st in polled if isinstance(st.get("version"), int)]
        out[name] = {
            "samples_generated": generated,
            "samples_stored": stored.get(name),
            "samples_trained": trained.get(name, 0),
            "trained_per_generated": trained.get(name, 0) / generated if generated else None,
            "samples_too_stale": sum(int(st.get("samples_too_stale") or 0) for st in lives),
            "version_lag_mean": lag_sum / generated if generated else None,
            "version_lag_max": max((int(st.get("version_lag_max") or 0) for st in lives), default=None),
            "versions_served": [versions[0], versions[-1]] if versions else None,
            "restarts": max(0, len(lives) - 1),
        }
    return out


def account_line(account: dict[str, Any]) -> str:
    """One searcher's account in one short line, for the report."""

    def count(x: Any) -> str:
        return f"{x:,}" if isinstance(x, int) else "-"

    per = account.get("trained_per_generated")
    lag_mean, lag_max = account.get("version_lag_mean"), account.get("version_lag_max")
    served = account.get("versions_served")
    return (
        f"{count(account.get('samples_generated'))} generated, {count(account.get('samples_stored'))} stored, "
        f"{count(account.get('samples_trained'))} trained on ({'-' if per is None else f'{per:.2f}'}x), "
        f"{count(account.get('samples_too_stale'))} too stale; lag "
        f"{'-' if lag_mean is None else f'{lag_mean:.1f}'} mean, {count(lag_max)} max"
        + (f"; v{served[0]} → v{served[1]}" if served else "")
    )


def spans_as_dicts(spans: list[WarningSpan]) -> list[dict[str, Any]]:
    return [asdict(s) for s in spans]
