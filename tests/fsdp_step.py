"""One trainer step on a fixed batch, on as many ranks as the launcher started (tests/integration/test_fsdp.py).

``python -m torch.distributed.run --nproc-per-node N -m tests.fsdp_step MODEL OUT [LORA_RANK]`` (or plain
``python -m tests.fsdp_step`` for one process): the tiny model (with LoRA adapters of LORA_RANK, if given),
sharded with FSDP2 under several ranks, takes one TB step with the trainer's Learner on :func:`batch`;
rank 0 writes the step's metrics and the whole model and optimizer states, gathered, to OUT, and
publishes them as a checkpoint under OUT/ckpt.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from services.trainer.batching import Row
from services.trainer.checkpointing import TrainerState, save_checkpoint
from services.trainer.distributed import Ranks, full_state, shard
from services.trainer.learner import Learner
from services.trainer.losses import make_loss
from services.trainer.optim import LRSchedule, build_optimizer
from tba.checkpoints import CheckpointStore
from tba.model.adapters import wrap_for_training
from tba.model.tokenizer import load_tokenizer
from tba.settings import DEFAULT_TARGETS

T = 0.7
TOKEN_BUDGET = 96  # small: the ranks' shares take different numbers of micro-batches


def batch(vocab: int, prompts: int = 5, samples: int = 4, seed: int = 0) -> list[Row]:
    """``prompts`` x ``samples`` rows of different lengths, rewards and reference log-probs (deterministic)."""
    g = torch.Generator().manual_seed(seed)
    rows = []
    for p in range(prompts):
        prompt = tuple(torch.randint(3, vocab, (3 + 2 * p,), generator=g).tolist())
        for _ in range(samples):
            n = int(torch.randint(2, 12, (1,), generator=g))
            completion = tuple(torch.randint(3, vocab, (n,), generator=g).tolist())
            reward = float(torch.rand(1, generator=g))
            rows.append(Row(("t", f"p{p}"), prompt, completion, reward, -3.0 * n, 0, 0))
    return rows


def main(model_dir: str, out: str, lora_rank: int = 0) -> None:
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(1)
    ranks = Ranks.from_env()
    ranks.start("cpu")
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    if lora_rank:
        model = wrap_for_training(model, model_dir, lora_rank, 16.0, 0.0, DEFAULT_TARGETS)
        with torch.no_grad():  # adapters that matter (peft starts B at zero)
            for name, p in model.named_parameters():
                if "lora_B" in name:
                    p.copy_(torch.randn(p.shape, generator=torch.Generator().manual_seed(len(name))) * 0.05)
    if ranks.distributed:
        model = shard(model)
    optimizer, scheduler = build_optimizer(model, 1e-3, 0.0, LRSchedule())
    learner = Learner(
        model,
        optimizer,
        scheduler,
        make_loss("tb"),
        temperature=T,
        pad_id=0,
        token_budget=TOKEN_BUDGET,
        grad_clip=1.0,
        ranks=ranks,
    )
    result = learner.step(batch(int(model.config.vocab_size)), beta=0.1)
    model_state, optimizer_state = full_state(model, optimizer, ranks)
    if ranks.main:
        Path(out).mkdir(parents=True, exist_ok=True)
        save_checkpoint(
            CheckpointStore(Path(out) / "ckpt"),
            model,
            load_tokenizer(model_dir),
            optimizer,
            scheduler,
            TrainerState(step=1, beta=0.1),
            model_state=model_state,
            optimizer_state=optimizer_state,
        )
        torch.save({"model": model_state, "optimizer": optimizer_state}, Path(out) / "state.pt")
        (Path(out) / "result.json").write_text(
            json.dumps(
                {
                    "metrics": result.metrics,
                    "grad_norm": result.grad_norm,
                    "samples": result.samples,
                    "tokens": result.tokens,
                    "micro_batches": result.micro_batches,
                    "world": ranks.world,
                }
            )
        )
    ranks.stop()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]) if len(sys.argv) > 3 else 0)
