"""Sharded trainer benchmark: the Learner on 2 FSDP2 ranks (gloo, torchrun) against 1 process, same batches.

Three runs of the same :data:`STEPS` TB steps on the same fixed batches (P=8 prompts x K=8 samples of
a few dozen tokens): one process with one torch thread, one process with two threads (all of this
machine's cores, the fair baseline), and two ranks with one thread each. Reported: tokens/s (the first
step, a warm-up, not counted) and each configuration's peak resident memory per process.

On 2 CPU cores the ranks can at best match one process using both cores: sharding pays for itself in
memory (each rank keeps half of the weights' and optimizer's state between steps), while every
forward and backward gathers each layer's weights over gloo and the gradients are reduced the same
way. On GPUs with NCCL the same code overlaps those transfers with compute.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks import Figure

PART = "fsdp"
STEPS = 4


def settings(model: Path | None = None, quick: bool = False) -> dict[str, Any]:
    """What the part runs with, for its record (``main`` takes its steps from here)."""
    return {
        "steps": 2 if quick else STEPS,
        "timed_steps": "all but the first",
        "prompts": 8,
        "samples_per_prompt": 8,
        "completion_tokens": [16, 47],
        "token_budget": 4096,
        "backend": "gloo",
        "configurations": ["1 process, 1 thread", "1 process, 2 threads", "2 ranks, 1 thread each"],
    }


def _batch(vocab: int, prompts: int = 8, samples: int = 8, seed: int = 0):
    import torch

    from services.trainer.batching import Row

    g = torch.Generator().manual_seed(seed)
    rows = []
    for p in range(prompts):
        prompt = tuple(torch.randint(3, vocab, (int(torch.randint(12, 40, (1,), generator=g)),), generator=g).tolist())
        for _ in range(samples):
            n = int(torch.randint(16, 48, (1,), generator=g))
            completion = tuple(torch.randint(3, vocab, (n,), generator=g).tolist())
            rows.append(Row(("bench", f"p{p}"), prompt, completion, float(torch.rand(1, generator=g)), -3.0 * n, 0, 0))
    return rows


def worker(model_dir: str, out: str, steps: int, threads: int) -> None:
    """One configuration's run (plain, or one rank under torchrun): timings and peak memory to ``out``."""
    import torch
    from transformers import AutoModelForCausalLM

    from services.trainer.distributed import Ranks, shard
    from services.trainer.learner import Learner
    from services.trainer.losses import make_loss
    from services.trainer.optim import LRSchedule, build_optimizer

    torch.set_num_threads(threads)
    ranks = Ranks.from_env()
    ranks.start("cpu")
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    if ranks.distributed:
        model = shard(model)
    optimizer, scheduler = build_optimizer(model, 1e-5, 0.0, LRSchedule())
    learner = Learner(
        model,
        optimizer,
        scheduler,
        make_loss("tb"),
        temperature=0.7,
        pad_id=0,
        token_budget=4096,
        grad_clip=1.0,
        ranks=ranks,
    )
    batches = [_batch(int(model.config.vocab_size), seed=s) for s in range(steps)]
    seconds = tokens = 0.0
    for i, rows in enumerate(batches):
        t0 = time.perf_counter()
        result = learner.step(rows, beta=0.1)
        if i:  # the first step warms up (allocations, thread pools)
            seconds += time.perf_counter() - t0
            tokens += result.tokens
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    per_rank = ranks.all_gather(peak_mb)
    if ranks.main:
        Path(out).write_text(json.dumps({"tokens_per_s": tokens / seconds, "peak_mb": per_rank}))
    ranks.stop()


def _run(model_dir: Path, work: Path, name: str, ranks: int, threads: int, steps: int) -> dict:
    out = work / f"{name}.json"
    launcher = (
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(ranks)]
        if ranks > 1
        else [sys.executable]
    )
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    proc = subprocess.run(
        [*launcher, "-m", "benchmarks.fsdp", "--worker", str(model_dir), str(out), str(steps), str(threads)],
        env=env,
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"{name} failed:\n{proc.stderr[-3000:]}")
    result = json.loads(out.read_text())
    print(f"[bench] fsdp {name}: {result['tokens_per_s']:.0f} tokens/s, peak {result['peak_mb']} MB", flush=True)
    return result


def main(model: Path | None = None, quick: bool = False) -> list[Figure]:
    from benchmarks import model_label
    from tba.model.tiny import init_model

    work = Path(tempfile.mkdtemp(prefix="tba-bench-fsdp-"))
    try:
        model_dir = Path(model) if model is not None else init_model(work / "tiny", seed=0)
        name = model_label(model_dir) if model is not None else "tiny"
        steps = settings(model, quick)["steps"]
        one = _run(model_dir, work, "1 process, 1 thread", 1, 1, steps)
        both = _run(model_dir, work, "1 process, 2 threads", 1, 2, steps)
        two = _run(model_dir, work, "2 ranks, 1 thread each", 2, 1, steps)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return [
        Figure(
            PART,
            f"learner tokens/s, {name}, 2 FSDP2 ranks (gloo) vs 1 process with both cores",
            two["tokens_per_s"],
            "tokens/s",
            both["tokens_per_s"],
            "report (2 cores)",
        ),
        Figure(
            PART,
            f"learner tokens/s, {name}, 2 FSDP2 ranks (gloo) vs 1 process with 1 core",
            two["tokens_per_s"],
            "tokens/s",
            one["tokens_per_s"],
            "report (2 cores)",
        ),
        Figure(
            PART,
            f"peak memory per rank, {name}, 2 FSDP2 ranks vs 1 process",
            max(two["peak_mb"]),
            "MB",
            both["peak_mb"][0],
            "report",
        ),
    ]


if __name__ == "__main__":
    import argparse

    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        worker(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]))
        sys.exit(0)
    from benchmarks import format_table
    from tba.model.importer import resolve_model

    parser = argparse.ArgumentParser(prog="python -m benchmarks.fsdp", description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="model directory or packaged model name (default: the tiny model)")
    parser.add_argument("--quick", action="store_true", help="two steps per configuration: figures mean little")
    args = parser.parse_args()
    print(format_table(main(resolve_model(args.model) if args.model else None, args.quick)))
