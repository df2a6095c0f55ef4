"""The sharded trainer (FSDP2, gloo on the CPU): 2 ranks under torchrun take the same step as 1 process.

Each run is ``tests/fsdp_step.py``: the tiny model, one TB step on a fixed batch of 5 prompts (shares of
3 and 2 prompts, with different numbers of micro-batches), then the whole model and optimizer states
gathered on rank 0. Tolerance: the ranks add the same numbers in another order, so float32 rounding
(about 1e-7 relative) is all that may differ: the loss, metrics, gradient norm and Adam moments agree to
1e-5 relative. The weights after one AdamW step at lr 1e-3 agree to 1e-5 (1% of the largest step):
Adam's first step is lr * g / (|g| + 1e-8), which turns a rounding difference in a gradient of about
1e-9 (a few of the 200k weights) into a few 1e-6 of movement; everywhere else they agree to 1e-7.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tba.health import free_port

pytestmark = pytest.mark.slow


def run_step(tiny_model: Path, out: Path, ranks: int, lora_rank: int = 0) -> tuple[dict, dict]:
    launcher = (
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc-per-node",
            str(ranks),
            "--master-addr",
            "127.0.0.1",
            "--master-port",
            str(free_port()),
        ]
        if ranks > 1
        else [sys.executable]
    )
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [*launcher, "-m", "tests.fsdp_step", str(tiny_model), str(out), str(lora_rank)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    (out.parent / f"{out.name}.log").write_text(proc.stderr)
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = json.loads((out / "result.json").read_text())
    assert result["world"] == ranks
    return result, torch.load(out / "state.pt", weights_only=True)


@pytest.mark.parametrize("lora_rank", [0, 8], ids=["full", "lora"])
def test_two_ranks_take_the_one_process_step(tiny_model: Path, tmp_path: Path, lora_rank: int) -> None:
    one, one_state = run_step(tiny_model, tmp_path / "one", 1, lora_rank)
    two, two_state = run_step(tiny_model, tmp_path / "two", 2, lora_rank)
    assert two["samples"] == one["samples"] == 20 and two["tokens"] == one["tokens"]
    assert two["micro_batches"] >= 2
    for name, value in one["metrics"].items():
        assert two["metrics"][name] == pytest.approx(value, rel=1e-5, abs=1e-6), name
    assert two["grad_norm"] == pytest.approx(one["grad_norm"], rel=1e-5)
    assert one_state["model"].keys() == two_state["model"].keys()
    close = total = 0
    for name, weight in one_state["model"].items():
        torch.testing.assert_close(two_state["model"][name], weight, atol=1e-5, rtol=0, msg=name)
        close += int(((two_state["model"][name] - weight).abs() <= 1e-7).sum())
        total += weight.numel()
    assert close >= 0.9999 * total, f"only {close} of {total} weights agree to 1e-7"
    if not lora_rank:
        from transformers import AutoModelForCausalLM

        base = AutoModelForCausalLM.from_pretrained(str(tiny_model), dtype=torch.float32).state_dict()
        moved = max((w - base[n]).abs().max().item() for n, w in one_state["model"].items())
        assert moved > 1e-4, "the step must move the weights for the comparison to mean much"
    one_opt, two_opt = one_state["optimizer"]["state"], two_state["optimizer"]["state"]
    assert one_opt.keys() == two_opt.keys() and one_opt
    if lora_rank:
        assert all("lora_" in name for name in one_opt), "a LoRA run's optimizer holds the adapters only"
    # Both published the same checkpoint: a whole model (or the adapters) that loads as is.
    from tba.checkpoints import CheckpointStore
    from tba.model.evaluation import load_model
    from tba.model.logprobs import sequence_logprobs
    from tests.fsdp_step import T, batch

    logprobs = []
    for run in ("one", "two"):
        store = CheckpointStore(tmp_path / run / "ckpt")
        directory = store.verify(store.read_manifest())
        assert (directory / ("adapter_model.safetensors" if lora_rank else "model.safetensors")).is_file()
        model, _ = load_model(directory)
        rows = batch(int(model.config.vocab_size))
        with torch.no_grad():
            logprobs.append(
                sequence_logprobs(
                    model, [list(r.prompt_ids) for r in rows], [list(r.completion_ids) for r in rows], T, 0
                )
            )
    torch.testing.assert_close(logprobs[1], logprobs[0], atol=1e-4, rtol=1e-5)
    for name, state in one_opt.items():
        for key in ("exp_avg", "exp_avg_sq"):
            torch.testing.assert_close(two_opt[name][key], state[key], atol=1e-6, rtol=1e-5, msg=f"{name} {key}")
