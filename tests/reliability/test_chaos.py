"""Short form of the chaos suite (reliability/chaos.py, ``make chaos``): the same faults and pass criteria on a
run of a few minutes, each part killed once (seed from ``TBA_CHAOS_SEED``, default 0). Writes no report."""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path

import pytest

from reliability.chaos import CRITERIA, ChaosConfig, ChaosResult, run_chaos

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.vllm]

SEED = int(os.environ.get("TBA_CHAOS_SEED", "0"))


@pytest.fixture(scope="module")
def chaos(tmp_path_factory: pytest.TempPathFactory, sft_model: Path) -> ChaosResult:
    config = ChaosConfig(
        minutes=4,
        kills=1,
        seed=SEED,
        outage_seconds=25,
        disk_full_seconds=20,
        calm_seconds=75,
        eval_every=60,
        eval_prompts=200,
        base_model=sft_model,
    )
    return run_chaos(config, tmp_path_factory.mktemp("chaos") / "run")


def test_every_fault_was_made_and_recovered_from(chaos: ChaosResult) -> None:
    tried = Counter((f.kind, f.target) for f in chaos.faults if f.at is not None)
    assert tried == {
        **{("kill", part): 1 for part in chaos.config.parts},
        ("redis unreachable", "redis"): 1,
        ("checkpoint volume full", "trainer"): 1,
    }, f"seed {SEED}: {tried}"
    failed = [f"{f.kind} {f.target} at {f.at} s: {f.outcome}" for f in chaos.faults if not f.ok]
    assert failed == [], f"seed {SEED}"


@pytest.mark.parametrize("criterion", list(CRITERIA))
def test_pass_criterion(chaos: ChaosResult, criterion: str) -> None:
    check = chaos.checks[criterion]
    assert check.ok, f"{CRITERIA[criterion]} (seed {SEED}, run {chaos.run_dir}): {check.detail}"
