"""The whole system as processes: real redis-server, buffer, trainer, two searchers with real vLLM.

One ``tba up`` run on a small step budget (the run ends when the trainer has made
``STEPS`` steps, so a slow start on a busy machine only makes it longer, with
``MINUTES`` as the guard); then every claim of the end-to-end issue is checked
against what the run left on disk and in its summary.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from reliability.procs import running_with

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.vllm]

STEPS = int(os.environ.get("TBA_E2E_STEPS", "24"))
MINUTES = float(os.environ.get("TBA_E2E_MINUTES", "12"))


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory, sft_model: Path) -> dict:
    run_dir = tmp_path_factory.mktemp("e2e") / "run"
    env = {
        **os.environ,
        "TBA_CHECKPOINT_EVERY": "2",
        "TBA_WARMUP_SAMPLES": "64",
        "TBA_CHECKPOINT_GRACE_SECONDS": "5",
        "TBA_KEEP_CHECKPOINTS": "3",
    }
    cmd = [sys.executable, "-m", "tba.cli", "up", "--no-console", "--searchers", "2", "--minutes", str(MINUTES),
           "--max-steps", str(STEPS), "--run-dir", str(run_dir), "--base-model", str(sft_model),
           "--eval-every", "20", "--eval-prompts", "100"]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=MINUTES * 60 + 240)
    assert proc.returncode == 0, f"tba up failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    summary = json.loads((run_dir / "summary.json").read_text())
    return {"dir": run_dir, "summary": summary, "stdout": proc.stdout}


def test_trainer_published_versions(run: dict) -> None:
    versions = run["summary"]["versions_published"]
    assert len(versions) >= 3, f"only {versions} published"
    assert versions == sorted(set(versions)), "a version number was reused"


def test_both_searchers_reloaded(run: dict) -> None:
    searcher_versions = run["summary"]["searcher_versions"]
    assert set(searcher_versions) == {"searcher-0", "searcher-1"}, searcher_versions
    # The warm-up is generated from the base model (version 0). A searcher whose engine comes up after the
    # trainer's first checkpoints (the trainer needs one searcher's batch to start) catches up before its
    # first batch, so only the first to start is sure to publish version 0.
    assert any(0 in versions for versions in searcher_versions.values()), searcher_versions
    for name, versions in searcher_versions.items():
        assert versions, f"{name} published nothing"
        assert max(versions) > 0, f"{name} never carried a reloaded version: {versions}"
        assert set(versions) <= set(run["summary"]["versions_published"]) | {0}


def test_buffer_accounting_adds_up(run: dict) -> None:
    b = run["summary"]["buffer"]
    assert b["samples_ingested"] > 0
    assert b["samples_ingested"] == (
        b["samples"] + b["samples_evicted"] + b["samples_duplicate"] + b["samples_dead_lettered"]
    ), b
    assert run["summary"]["groups_published"] == b["groups_ingested"], "a published group was not ingested"


def test_final_checkpoint_loads_and_evaluates(run: dict) -> None:
    from tba.checkpoints import CheckpointStore
    from tba.evaluate import evaluate_checkpoint

    store = CheckpointStore(run["dir"] / "checkpoints")
    manifest = store.read_manifest()
    assert manifest is not None and manifest.version == max(run["summary"]["versions_published"])
    result = evaluate_checkpoint(store.verify(manifest), "arithmetic", n_prompts=50, samples=0)
    assert 0.0 <= result["greedy_accuracy"] <= 1.0
    assert run["summary"]["accuracy_end"] is not None


def test_outputs_written(run: dict) -> None:
    d = run["dir"]
    for name in ("buffer", "trainer", "searcher-0", "searcher-1", "redis"):
        assert (d / "logs" / f"{name}.log").stat().st_size > 0, name
    assert (d / "report.html").read_text().count("data:image/png;base64") >= 2
    for key in ("versions_published", "searcher_versions", "groups_published", "groups_stored",
                "accuracy_start", "accuracy_end", "wall_seconds"):
        assert key in run["summary"], key


def test_no_error_lines_in_logs(run: dict) -> None:
    pattern = re.compile(r"\b(ERROR|CRITICAL)\b|Traceback \(most recent call last\)")
    for log in (run["dir"] / "logs").glob("*.log"):
        bad = [line for line in log.read_text(errors="replace").splitlines() if pattern.search(line)]
        assert not bad, f"{log.name}: {bad[:5]}"


def test_nothing_left_running(run: dict) -> None:
    """No process of the run survives it: searched by command line and by environment (vLLM's engines)."""
    alive = running_with(str(run["dir"]))
    assert not alive, f"still running: {alive}"
