"""Short form of the chaos suite (reliability/chaos.py, ``make chaos``): the same faults and pass criteria on a
run of a few minutes, each part killed once (seed from ``TBA_CHAOS_SEED``, default 0). Writes no report."""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from tests.reliability.suites import run_suite

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.vllm]

SEED = int(os.environ.get("TBA_CHAOS_SEED", "0"))
CRITERIA = (  # reliability/chaos.py CRITERIA
    "published_equals_stored",
    "versions_increase",
    "trainer_resumes",
    "searchers_on_newest",
    "nothing_left_behind",
    "accuracy_improves",
    "clean_exit",
)


@pytest.fixture(scope="module")
def chaos(tmp_path_factory: pytest.TempPathFactory, sft_model: Path) -> dict[str, Any]:
    work = tmp_path_factory.mktemp("chaos")
    options = {
        "--minutes": 4,
        "--kills": 1,
        "--seed": SEED,
        "--outage": 25,
        "--disk-full": 20,
        "--calm": 75,
        "--eval-every": 60,
        "--eval-prompts": 200,
        "--base-model": sft_model,
        "--run-dir": work / "run",
    }
    return run_suite("chaos", *(x for pair in options.items() for x in pair), workdir=work, timeout=1800)


def test_every_fault_was_made_and_recovered_from(chaos: dict[str, Any]) -> None:
    tried = Counter((f["kind"], f["target"]) for f in chaos["faults"] if f["at"] is not None)
    assert tried == {
        **{("kill", part): 1 for part in chaos["parts"]},
        ("redis unreachable", "redis"): 1,
        ("checkpoint volume full", "trainer"): 1,
    }, f"seed {SEED}: {tried}"
    failed = [f"{f['kind']} {f['target']} at {f['at']} s: {f['outcome']}" for f in chaos["faults"] if not f["ok"]]
    assert failed == [], f"seed {SEED}"


def test_every_criterion_was_checked(chaos: dict[str, Any]) -> None:
    assert sorted(chaos["checks"]) == sorted(CRITERIA)


@pytest.mark.parametrize("criterion", CRITERIA)
def test_pass_criterion(chaos: dict[str, Any], criterion: str) -> None:
    check = chaos["checks"][criterion]
    assert check["ok"], f"{criterion} (seed {SEED}, run {chaos['run_dir']}): {check['detail']}"
