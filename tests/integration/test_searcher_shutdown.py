"""A shutdown signal that reaches vLLM's engine core while the searcher reloads (a SIGTERM sent to the
process group: Ctrl-C, a supervisor stopping the group). The reload fails; restoring the previous
weights would send another call to the dying engine core, which never answers (vLLM's client waits
without a timeout), so the searcher hung. Now it does not restore, and exits 0 with the spill queue
flushed. Its own engine: the test kills it."""

from __future__ import annotations

import signal
import threading
import time
from pathlib import Path

import pytest

from services.searcher.engine import Engine
from services.searcher.loop import Searcher
from services.searcher.scorer import Scorer
from tba.checkpoints import CheckpointStore, announce
from tba.codec import decode
from tba.keys import STREAM_FIELD, Keys
from tba.model.tiny import init_model
from tba.schemas import ScoredGroup
from tba.settings import SearcherSettings
from tba.tasks import make_task

pytestmark = [pytest.mark.slow, pytest.mark.vllm]


def test_shutdown_during_a_reload_exits_cleanly(redis_server, tmp_path: Path, tiny_model: Path) -> None:
    settings = SearcherSettings(
        model=tiny_model,
        redis_url=redis_server.url,
        namespace="t",
        checkpoint_dir=tmp_path / "ckpt",
        spill_dir=tmp_path / "spill",
        searcher_id="s-stop",
        completions_per_prompt=4,
        prompts_per_batch=3,
        max_new_tokens=8,
        max_model_len=64,
        kv_cache_gib=1,
        reload_poll_seconds=0.2,
        flush_timeout_seconds=5.0,
    )
    engine = Engine(settings, tiny_model, version=0, seed=0)
    scorer = Scorer(settings, make_task("arithmetic"), settings.searcher_id)
    try:
        redis_server.stop(kill=True)  # a first run spills its batch to disk ...
        searcher = Searcher(settings.model_copy(update={"max_batches": 1}), engine, scorer)
        try:
            assert searcher.run() == 0
            spilled = [decode(e.payload, ScoredGroup).group_id for e in searcher.spill.peek(100)]
        finally:
            searcher.close()
        assert len(spilled) == 3
        redis_server.start()  # ... which the next run must publish although it stops during its first reload
        store = CheckpointStore(settings.checkpoint_dir)
        tmp = store.new_tmp_dir()
        init_model(tmp, seed=11)
        announce(redis_server.client(), Keys("t"), store.commit(tmp, version=1, step=1))

        # The engine core takes the group's SIGTERM ...
        core = engine.llm.llm_engine.engine_core.resources.engine_manager.processes[0]
        core.terminate()
        core.join(timeout=60)
        deadline = time.monotonic() + 30
        while engine.alive() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not engine.alive()

        searcher = Searcher(settings, engine, scorer)

        def signal_during_reload() -> None:  # ... and this process takes it while it reloads
            while searcher.state != "reloading":
                time.sleep(0.005)
            searcher.stop.on_signal(signal.SIGTERM)

        threading.Thread(target=signal_during_reload, daemon=True).start()
        t0 = time.monotonic()
        try:
            assert searcher.run() == 0
            status = searcher.status()
        finally:
            searcher.close()
        assert time.monotonic() - t0 < 30
        assert engine.version == 0 and status["reloads"] == 0 and status["state"] == "stopped"
        published = [
            decode(f[STREAM_FIELD.encode()], ScoredGroup).group_id
            for _id, f in redis_server.client().xrange(Keys("t").trajectories)
        ]
        assert published == spilled  # the spill queue was flushed
        assert status["spilled"] == 0 and not list((tmp_path / "spill").glob("*.msgpack"))
    finally:
        engine.close()
