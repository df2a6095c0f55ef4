"""`tba up --trainer-procs 2`: the trainer as two FSDP2 ranks under torchrun inside the whole system.

One searcher (real vLLM), the buffer, Redis and a 2-rank trainer (gloo) on the SFT base, for a few
steps: both ranks train, rank 0 publishes whole checkpoints that the searcher reloads, evaluation reads
them, and nothing of the run is left running.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tba.local.commands import tba_command
from tests.e2e.test_local_run import test_nothing_left_running as _nothing_left_running

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.vllm]

STEPS = 6


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory, sft_model: Path) -> dict:
    run_dir = tmp_path_factory.mktemp("sharded") / "run"
    env = {**os.environ, "TBA_CHECKPOINT_EVERY": "2", "TBA_WARMUP_SAMPLES": "32", "TBA_CHECKPOINT_GRACE_SECONDS": "5"}
    cmd = tba_command(
        "up",
        no_console=True,
        searchers=1,
        trainer_procs=2,
        minutes=8,
        max_steps=STEPS,
        run_dir=run_dir,
        base_model=sft_model,
        eval_every=30,
        eval_prompts=50,
        no_report=True,
    )
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=8 * 60 + 240)
    assert proc.returncode == 0, f"tba up failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return {"dir": run_dir, "summary": json.loads((run_dir / "summary.json").read_text())}


def test_two_ranks_trained_and_the_searcher_served_their_checkpoints(run: dict) -> None:
    log = (run["dir"] / "logs" / "trainer.log").read_text()
    assert "trainer rank 0 of 2" in log and "trainer rank 1 of 2" in log
    assert f"step {STEPS}/{STEPS}" in log, log[-2000:]
    versions = run["summary"]["versions_published"]
    assert versions == sorted(set(versions)) and max(versions) == STEPS, versions
    assert max(run["summary"]["searcher_versions"]["searcher-0"]) > 0, "the searcher never reloaded"


def test_the_final_checkpoint_is_one_whole_model(run: dict) -> None:
    from tba.checkpoints import CheckpointStore
    from tba.model.evaluation import evaluate_checkpoint

    store = CheckpointStore(run["dir"] / "checkpoints")
    directory = store.verify(store.read_manifest())
    assert (directory / "model.safetensors").is_file() and not list(directory.glob("*-of-*"))
    assert 0.0 <= evaluate_checkpoint(directory, "arithmetic", n_prompts=20, samples=0)["greedy_accuracy"] <= 1.0


def test_nothing_left_running(run: dict) -> None:
    _nothing_left_running(run)
