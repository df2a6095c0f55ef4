"""LoRA benchmark: what an adapter-only checkpoint saves against a full one of the same model, publish to serving.

For the same base model (the tiny one, or ``--model``), one trainer step's worth of state each:
(a) full fine-tuning: the whole model plus its AdamW state; (b) LoRA (rank :data:`RANK` on every attention
and MLP projection): the adapters plus their AdamW state. Measured in the same run:

1. publish time (write, fsync, hash, rename, manifest: ``save_checkpoint``) and the checkpoint's bytes;
2. publish -> serving: the publish, the searcher's hash check of the new directory (its watcher thread)
   and the engine's switch to it (an in-place reload of the full weights, or adding the adapter and
   removing the previous one), one after the other: how long after a trainer step a searcher can
   generate from it, less the wait for the batch in progress to end. Reported with the switch alone.

Medians of :data:`REPEATS` alternating publishes (the engine's first load of each kind not counted).
"""

from __future__ import annotations

import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks import Figure

PART = "lora"
RANK = 16
REPEATS = 5


def settings(model: Path | None = None, quick: bool = False) -> dict[str, Any]:
    """What the part runs with, for its record (``main`` takes its repeats from here)."""
    return {
        "lora_rank": RANK,
        "lora_alpha": 2.0 * RANK,
        "targets": "every attention and MLP projection",
        "repeats": 1 if quick else REPEATS,
        "statistic": "median",
        "max_model_len": 128,
    }


def _state(model_dir: Path, lora: bool):
    """(model, optimizer, scheduler) after one AdamW step: the optimizer state a checkpoint carries exists."""
    import torch
    from transformers import AutoModelForCausalLM

    from services.trainer.optim import LRSchedule, build_optimizer
    from tba.model.adapters import wrap_for_training
    from tba.settings import DEFAULT_TARGETS

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    if lora:
        model = wrap_for_training(model, model_dir, RANK, 2.0 * RANK, 0.0, DEFAULT_TARGETS)
    optimizer, scheduler = build_optimizer(model, 1e-4, 0.0, LRSchedule())
    model(input_ids=torch.tensor([[1, 5, 6, 7]])).logits.sum().backward()
    optimizer.step()
    return model, optimizer, scheduler


def _mb(directory: Path) -> float:
    return sum(f.stat().st_size for f in directory.rglob("*") if f.is_file()) / 2**20


def measure(model_dir: Path, work: Path, engine, kind: str, repeats: int) -> dict[str, float]:
    """Median publish, hash check and switch (seconds) and the checkpoint's MB, for ``kind`` full or lora."""
    from services.trainer.checkpointing import TrainerState, save_checkpoint
    from tba.checkpoints import CheckpointStore
    from tba.model.tokenizer import load_tokenizer

    model, optimizer, scheduler = _state(model_dir, lora=kind == "lora")
    tokenizer = load_tokenizer(model_dir)
    store = CheckpointStore(work / f"ckpt-{kind}")
    publish, verify, switch = [], [], []
    for step in range(repeats + 1):
        t0 = time.perf_counter()
        manifest = save_checkpoint(store, model, tokenizer, optimizer, scheduler, TrainerState(step=step + 1, beta=0.1))
        t1 = time.perf_counter()
        directory = store.verify(manifest)
        t2 = time.perf_counter()
        engine.reload(directory, manifest.version)
        t3 = time.perf_counter()
        if step:  # the engine's first load of this kind allocates what the later ones reuse
            publish.append(t1 - t0)
            verify.append(t2 - t1)
            switch.append(t3 - t2)
        size = _mb(directory)
        store.prune(keep=2, grace_seconds=0.0)
    shutil.rmtree(store.root)
    return {
        "publish": statistics.median(publish),
        "verify": statistics.median(verify),
        "switch": statistics.median(switch),
        "mb": size,
    }


def main(model: Path | None = None, quick: bool = False) -> list[Figure]:
    from benchmarks import model_label
    from services.searcher.engine import Engine
    from tba.model.tiny import init_model
    from tba.settings import SearcherSettings

    work = Path(tempfile.mkdtemp(prefix="tba-bench-lora-"))
    try:
        model_dir = Path(model) if model is not None else init_model(work / "tiny", seed=0)
        name = model_label(model_dir) if model is not None else "tiny"
        searcher = SearcherSettings(
            model=model_dir,
            redis_url="redis://127.0.0.1:1/0",
            namespace="bench",
            checkpoint_dir=work / "unused",
            spill_dir=work / "spill",
            searcher_id="bench",
            max_model_len=128,
            kv_cache_gib=1,
            lora_rank=RANK,
        )
        engine = Engine(searcher, model_dir, version=0, seed=0)
        repeats = settings(model, quick)["repeats"]
        try:
            full = measure(model_dir, work, engine, "full", repeats)
            lora = measure(model_dir, work, engine, "lora", repeats)
        finally:
            engine.close()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"[bench] lora {name}: full {full}, adapter {lora}", flush=True)

    def total(m: dict[str, float]) -> float:
        return m["publish"] + m["verify"] + m["switch"]

    label = f"{name}, rank {RANK} adapter vs full checkpoint"
    return [
        Figure(PART, f"checkpoint size, {label} (each with its AdamW state)", lora["mb"], "MB", full["mb"], "<< full"),
        Figure(PART, f"checkpoint publish, {label}", lora["publish"], "s", full["publish"], "<< full"),
        Figure(
            PART,
            f"searcher switch to the new version (adapter add vs in-place reload), {name}",
            lora["switch"],
            "s",
            full["switch"],
            "<< full",
        ),
        Figure(
            PART,
            f"publish -> searcher serving it (publish + hash + switch), {name}",
            total(lora),
            "s",
            total(full),
            "<< full",
        ),
    ]


if __name__ == "__main__":
    import argparse

    from benchmarks import format_table
    from tba.model.importer import resolve_model

    parser = argparse.ArgumentParser(prog="python -m benchmarks.lora", description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="model directory or packaged model name (default: the tiny model)")
    parser.add_argument("--quick", action="store_true", help="one publish of each kind: figures mean little")
    args = parser.parse_args()
    print(format_table(main(resolve_model(args.model) if args.model else None, args.quick)))
