"""Environments from the ecosystem inside ``tba up``, at smoke scale: the real system (redis-server, buffer,
trainer, a searcher with vLLM) on a multi-turn tool task, a reasoning-gym generator and a verifiers taskset.

Each run ends after ``STEPS`` trainer steps; what it left (summary, timeline, evaluations) shows that groups
were stored, the trainer stepped and the held-out evaluation ran, and for the multi-turn task that the
episodes held the environment's tokens and that none of them failed.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tba.local.commands import tba_command
from tba.local.report import read_jsonl

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.vllm]

STEPS = 6
MINUTES = 8.0  # the guard; the run ends at STEPS


@pytest.fixture(scope="module")
def calculator_model() -> Path:
    """The calculator task's SFT base (tool calls in its format), built once and cached like the demo's."""
    from tba.model.sft import ensure_base_model

    return ensure_base_model(task="calculator")


def run_up(
    run_dir: Path, task: str, options: dict, base_model: Path, env_server: bool = False, **env_vars: str
) -> dict:
    """One ``tba up`` of ``task``; its summary, with the searchers' last status from the timeline."""
    env = {**os.environ, "TBA_TASK_OPTIONS": json.dumps(options), "TBA_WARMUP_SAMPLES": "32", **env_vars}
    cmd = tba_command(
        "up",
        no_console=True,
        no_report=True,
        searchers=1,
        placement="shared",  # every process anywhere (tests/e2e/test_no_orphans.py runs the default)
        minutes=MINUTES,
        max_steps=STEPS,
        run_dir=run_dir,
        task=task,
        base_model=base_model,
        eval_every=20,
        eval_prompts=40,
        env_server=env_server,
    )
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=MINUTES * 60 + 240)
    assert proc.returncode == 0, f"tba up failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    summary = json.loads((run_dir / "summary.json").read_text())
    # The last status the searcher answered (a poll during its shutdown records an error instead).
    rows = [
        r
        for r in read_jsonl(run_dir / "timeline.jsonl")
        if "episodes" in (r.get("searchers") or {}).get("searcher-0", {})
    ]
    summary["searcher_status"] = rows[-1]["searchers"]["searcher-0"] if rows else {}
    return summary


def check_trained(summary: dict) -> None:
    assert summary["state"] == "complete", summary.get("events")
    assert summary["groups_stored"] > 0 and summary["buffer"]["samples"] > 0
    assert summary["trainer_steps"] >= STEPS
    assert len(summary["evaluations"]) >= 2, "the held-out evaluation ran at the start and again"
    assert all(0.0 <= e["accuracy"] <= 1.0 for e in summary["evaluations"])


def test_a_multi_turn_tool_task_trains_inside_tba_up(tmp_path: Path, calculator_model: Path) -> None:
    """The calculator: the model's tool calls, the calculator's answers as environment tokens, the trainer
    stepping on those trajectories, and the episode-aware held-out evaluation (its base starts above 0)."""
    summary = run_up(tmp_path / "run", "calculator", {}, calculator_model)
    check_trained(summary)
    status = summary["searcher_status"]
    assert status["episodes"] > 0 and status["episode_turns"] > status["episodes"], "no tool call was made"
    assert status["env_tokens"] > 0 and status["episode_failures"] == {}
    assert summary["evaluations"][0]["accuracy"] > 0.0


def test_a_reasoning_gym_generator_trains_inside_tba_up(tmp_path: Path, sft_model: Path) -> None:
    """reasoning-gym's chain_sum, scored by its own scorer, on the arithmetic base (same alphabet)."""
    options = {"dataset": "chain_sum", "config": {"min_terms": 2, "max_terms": 2, "max_digits": 1}}
    summary = run_up(tmp_path / "run", "reasoning-gym", options, sft_model)
    check_trained(summary)
    assert summary["searcher_status"]["episodes"] == 0  # single-turn: no episode loop


def test_a_verifiers_taskset_trains_inside_tba_up(tmp_path: Path, sft_model: Path) -> None:
    """A verifiers taskset loaded by name (tests/envs/vf_sums.py, on PYTHONPATH as an installed one would be),
    its rows the prompts and its reward function the reward, on the arithmetic base (the same format)."""
    envs = Path(__file__).resolve().parents[1] / "envs"
    pythonpath = os.pathsep.join(filter(None, [str(envs), os.environ.get("PYTHONPATH", "")]))
    summary = run_up(tmp_path / "run", "verifiers", {"env": "vf-sums"}, sft_model, PYTHONPATH=pythonpath)
    check_trained(summary)
    assert summary["evaluations"][0]["accuracy"] > 0.1  # the base adds: the taskset's reward sees it


def test_a_multi_turn_task_served_over_openenv_trains_inside_tba_up(tmp_path: Path, calculator_model: Path) -> None:
    """``tba up --env-server``: the calculator served by ``tba envserver`` beside the searchers, which reach it
    (and the run's evaluations too) over OpenEnv's client; the same episodes as in process."""
    summary = run_up(tmp_path / "run", "calculator", {}, calculator_model, env_server=True)
    check_trained(summary)
    status = summary["searcher_status"]
    assert summary["endpoints"]["envserver"].startswith("http://127.0.0.1:")
    assert status["episode_turns"] > status["episodes"] > 0 and status["env_tokens"] > 0
    assert status["episode_failures"] == {}
    assert summary["evaluations"][0]["accuracy"] > 0.0
