"""The real-model recipe end to end: ``tba up --profile real-model`` for a few steps on SmolLM2-135M-Instruct.

The packaged profile as a user runs it (``make demo-real``), only shorter: real redis-server, buffer, trainer and
searcher with the vLLM CPU engine, reasoning-gym's aiw in chat form read by the lenient reader. Rewards
flow from the task's scorer to the trainer, the trainer steps with the recipe's settings, the searcher reloads
what it publishes, and the run's held-out evaluation asks and reads as the searchers do.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from tba.local.commands import tba_command
from tba.local.report import read_jsonl

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.vllm]

STEPS = 3
MINUTES = 8.0
EVAL_PROMPTS = 8


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory, smollm2: Path) -> dict:
    run_dir = tmp_path_factory.mktemp("e2e-recipe") / "run"
    cmd = tba_command(
        "up",
        profile="real-model",
        no_console=True,
        minutes=MINUTES,
        max_steps=STEPS,
        run_dir=run_dir,
        eval_every=86400,  # the bound: the start and the end only
        eval_prompts=EVAL_PROMPTS,
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("TBA_") or k == "TBA_CACHE_DIR"}
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=MINUTES * 60 + 300)
    assert proc.returncode == 0, f"tba up failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return {
        "dir": run_dir,
        "summary": json.loads((run_dir / "summary.json").read_text()),
        "record": json.loads((run_dir / "run.json").read_text()),
    }


def test_the_recipe_is_what_ran(run: dict) -> None:
    applied = run["record"]["profile"]["applied"]
    assert applied["run"]["--task"][0] == "reasoning-gym" and applied["run"]["--backfill"][0] == "0"
    assert applied["trainer"]["TBA_DTYPE"] == ["bfloat16", "profile real-model.toml over default.toml"]
    searcher = run["record"]["services"]["searcher-0"]["settings"]
    assert searcher["task_options"]["dataset"] == "aiw" and searcher["task_options"]["reader"] == "lenient"
    assert searcher["max_samples_ahead"] == 64  # one training batch ahead of the trainer's draws
    assert run["summary"]["searchers"] == 1  # no backfill searcher


def test_rewards_flow_and_the_trainer_steps(run: dict) -> None:
    summary = run["summary"]
    assert summary["trainer_steps"] == STEPS
    rows = read_jsonl(run["dir"] / "trainer_metrics.jsonl")
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))
    assert all(r["samples"] == 64 for r in rows)  # the recipe's P=8 x K=8
    rewards = [s for r in rows for s in [r["reward_mean"]]]
    assert all(0.0 <= x <= 1.0 for x in rewards) and summary["buffer"]["reward_mean"] is not None
    split = summary["time_split"]["trainer"]
    assert split["seconds"]["forward"] > 0 and split["seconds"]["backward"] > 0 and 0 < split["busy_fraction"] <= 1
    assert set(summary["cpu_busy"]) >= {"cpu0"}


def test_the_searcher_reloaded_what_the_trainer_published(run: dict) -> None:
    """In place, in the one engine it started. The samples stored may all be the base model's: kept a batch ahead,
    the searcher generates only as the trainer draws, and three steps draw what it generated before the first
    checkpoint."""
    assert 0 in run["summary"]["searcher_versions"]["searcher-0"]
    log = (run["dir"] / "logs" / "searcher-0.log").read_text()
    reloaded = [int(v) for v in re.findall(r"reloaded v\d+ -> v(\d+) in place", log)]
    assert reloaded and max(reloaded) > 0 and log.count("vLLM engine up") == 1, reloaded


def test_the_evaluation_asks_and_reads_as_the_searchers(run: dict) -> None:
    summary = run["summary"]
    evaluation = summary["evaluation"]
    searcher = run["record"]["services"]["searcher-0"]["settings"]
    assert evaluation["task"] == "reasoning-gym" and evaluation["n_prompts"] == EVAL_PROMPTS
    for key in ("task_options", "chat_template", "system_prompt", "max_new_tokens", "stop"):
        assert evaluation[key] == searcher[key], key
    evals = summary["evaluations"]
    assert len(evals) >= 2 and evals[0]["version"] == 0
    assert all(round(e["accuracy"] * EVAL_PROMPTS, 6).is_integer() for e in evals)
