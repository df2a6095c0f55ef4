"""The GPU suite (benchmarks/gpu.py) on the CPU: every part runs end to end on a tiny configuration.

The suite is meant for a CUDA host; the code is the same on the CPU (gloo instead of NCCL, autocast on the
CPU), so this catches a part that no longer runs, a record that lost a field the page needs, and numerics
that are off, before a GPU is at hand."""

from __future__ import annotations

import copy
import json

import pytest

from benchmarks.gpu import render, run

pytestmark = pytest.mark.slow  # trains and publishes five tiny models: ~15 s

PARTS = ("publish", "numerics", "learner", "learner_gpu_step", "fsdp")


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    out = tmp_path_factory.mktemp("gpu") / "record.json"
    return out, run([], "cpu", out, smoke=True)


def test_every_part_runs_and_the_page_renders(smoke):
    out, record = smoke
    assert json.loads(out.read_text()) == record  # the record on disk is the whole run
    entry = record["sizes"]["smoke"]
    for part in PARTS:
        assert "error" not in entry[part], (part, entry[part])

    for part in ("learner", "learner_gpu_step"):
        for mode in ("full", "lora"):
            arms = entry[part][mode]
            assert arms["bare"]["tokens_per_s"] > 0 and arms["service"]["tokens_per_s"] > 0
            assert arms["ratio"] == arms["service"]["tokens_per_s"] / arms["bare"]["tokens_per_s"]
    assert entry["fsdp"]["fsdp2"]["tokens_per_s"] > 0

    n = entry["numerics"]
    assert n["shared_vs_padded_fp32_max_abs_diff"] < 1e-3  # the prefix-shared sums are the padded ones
    assert 0 < n["shared_max_abs_diff"] < 0.05 * abs(n["log_pi_fp32_mean"])  # bf16 ran, and stays close
    assert n["grad_cosine"] > 0.99

    p = entry["publish"]
    assert p["weights_mb"] > 0 and p["optimizer_and_state_mb"] > p["weights_mb"]  # two Adam moments per weight
    assert p["weights_only_seconds"] > 0 and p["with_optimizer_seconds"] > 0

    page = render(record)
    assert "| smoke | 0M | 8 x 8 | lora |" in page
    assert "failed" not in page


def test_a_failed_part_is_shown_on_the_page(smoke):
    record = copy.deepcopy(smoke[1])
    record["sizes"]["smoke"]["fsdp"] = {"error": "RuntimeError: NCCL unavailable"}
    assert "| smoke | failed: RuntimeError: NCCL unavailable |  |  |  |" in render(record)
