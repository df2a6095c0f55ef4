"""Wiring of one searcher process: health server, spill queue, initial weights, engine, loop, signals.

The health server comes up first, so ``/healthz`` answers while the engine
loads and ``/readyz`` says 503 until it generates. The engine always starts on
the base model (version 0); a searcher that starts after the trainer has
published catches up with an in-place reload of the newest verified checkpoint
before its first batch. Starting the engine on that checkpoint directly would
race with retention: the trainer may prune it while the engines start (seen
when a stack restarts on the volumes of an earlier run), and vLLM then fails on
the missing directory, while the reload path rejects a vanished checkpoint and
waits for the next.
"""

from __future__ import annotations

import json
import logging
import signal
from pathlib import Path

from prometheus_client import CollectorRegistry

from services.searcher.loop import Searcher, build_watcher, replica_seed
from services.searcher.spill import SpillLockedError, SpillQueue
from services.searcher.startup import StartupError
from tba.health import HealthServer
from tba.schemas import SearcherState
from tba.settings import SearcherSettings
from tba.tasks import Task

log = logging.getLogger(__name__)


class _Process:
    """What the health endpoints and signal handlers see while the process comes up."""

    def __init__(self, settings: SearcherSettings) -> None:
        self.settings = settings
        self.searcher: Searcher | None = None
        self.stop_requested = False

    def ready(self) -> tuple[bool, str]:
        return self.searcher.ready() if self.searcher else (False, "loading the engine")

    def status(self) -> dict:
        if self.searcher:
            return self.searcher.status()
        return {"searcher_id": self.settings.searcher_id, "state": SearcherState.LOADING, "version": None}

    def on_signal(self, signum: int, frame) -> None:
        if self.searcher is not None:
            self.searcher.stop.on_signal(signum, frame)
        else:
            log.warning("signal %d during start-up: exiting once the engine is up", signum)
            self.stop_requested = True


def run_service(settings: SearcherSettings, task: Task) -> int:
    from services.searcher.engine import Engine
    from services.searcher.scorer import Scorer

    try:
        spill = SpillQueue(settings.spill_dir, settings.spill_max_bytes)
    except (SpillLockedError, OSError) as err:
        raise StartupError(f"TBA_SPILL_DIR / --spill-dir: {err}") from None
    proc = _Process(settings)
    registry = CollectorRegistry()
    health = HealthServer(
        settings.metrics_host, settings.metrics_port, proc.ready, registry=registry, status=proc.status
    ).start()
    log.info(
        "searcher %s: health and metrics on http://%s:%d", settings.searcher_id, settings.metrics_host, health.port
    )
    previous = {sig: signal.signal(sig, proc.on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        watcher = build_watcher(settings, version=0)
        scorer = Scorer(settings, task, settings.searcher_id)
        engine = Engine(settings, Path(settings.model), 0, seed=replica_seed(settings.seed, settings.searcher_id))
        try:
            searcher = Searcher(settings, engine, scorer, watcher=watcher, spill=spill, registry=registry)
            proc.searcher = searcher
            if proc.stop_requested:
                searcher.request_stop()
            code = searcher.run()
        finally:
            engine.close()
        log.info("searcher %s stopped: %s", settings.searcher_id, json.dumps(searcher.status()))
        return code
    finally:
        spill.close()
        if proc.searcher is not None:
            proc.searcher.close()
        health.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
