"""LoRA adapters (peft): the trainer trains them, searchers serve them, evaluation and ``tba model merge`` read them.

A LoRA run trains low-rank adapters on top of a frozen base model: the optimizer holds the adapter
parameters only, and a checkpoint is peft's adapter directory (``adapter_config.json`` +
``adapter_model.safetensors``, a few MB) instead of the whole model. The base model stays the reference
model. A checkpoint directory is an adapter exactly when it holds ``adapter_config.json``; every reader
(:func:`load_for_inference`, the searcher's engine) decides on that file alone.

The adapter's ``base_model_name_or_path`` records the base directory the trainer wrapped, so a reader
on the same storage finds it; a reader elsewhere names the base itself (``base=``).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
# vLLM sizes its adapter slots by one of these ranks (``max_lora_rank``).
VLLM_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


class AdapterError(ValueError):
    """An adapter directory that cannot be used as asked (unreadable, other rank or base, no base found)."""


def is_adapter(directory: str | Path) -> bool:
    return (Path(directory) / ADAPTER_CONFIG).is_file()


def read_adapter_config(directory: str | Path) -> dict[str, Any]:
    path = Path(directory) / ADAPTER_CONFIG
    try:
        config = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise AdapterError(f"{path}: not a readable adapter config ({err})") from err
    kind = config.get("peft_type") if isinstance(config, dict) else None
    if kind != "LORA":
        raise AdapterError(f"{path}: not a LoRA adapter (peft_type {kind!r})")
    return config


def vllm_max_rank(rank: int) -> int:
    """The smallest adapter slot size vLLM offers that holds adapters of ``rank``."""
    for slot in VLLM_RANKS:
        if rank <= slot:
            return slot
    raise AdapterError(f"LoRA rank {rank} is above vLLM's largest ({VLLM_RANKS[-1]})")


def lora_config(rank: int, alpha: float, dropout: float, targets: Sequence[str]):
    from peft import LoraConfig

    # peft annotates lora_alpha as int; it only ever divides it by r, and a float alpha is what the setting holds
    return LoraConfig(
        r=rank,
        lora_alpha=alpha,  # type: ignore[arg-type]
        lora_dropout=dropout,
        target_modules=list(targets),
        bias="none",
        task_type="CAUSAL_LM",
    )


def wrap_for_training(
    model,
    base_dir: str | Path,
    rank: int,
    alpha: float,
    dropout: float,
    targets: Sequence[str],
    resume_from: str | Path | None = None,
):
    """The base ``model`` with trainable LoRA adapters: new ones, or those of ``resume_from`` (a checkpoint
    of this run, which must have the same rank and targets). Only the adapters require gradients."""
    from peft import PeftModel, get_peft_model

    model.config.name_or_path = str(Path(base_dir).resolve())  # becomes the adapter's base_model_name_or_path
    if resume_from is None:
        return get_peft_model(model, lora_config(rank, alpha, dropout, targets))
    saved = read_adapter_config(resume_from)
    if saved.get("r") != rank or sorted(saved.get("target_modules") or []) != sorted(targets):
        raise AdapterError(
            f"{resume_from}: the run's adapters have rank {saved.get('r')} on "
            f"{sorted(saved.get('target_modules') or [])}, the settings ask for rank {rank} on "
            f"{sorted(targets)}: resume with the run's settings or start a new run"
        )
    return PeftModel.from_pretrained(model, str(resume_from), is_trainable=True)


def base_of(adapter_dir: str | Path, base: str | Path | None = None) -> Path:
    """The base model directory of an adapter: ``base`` if given, else the one its config records."""
    recorded = read_adapter_config(adapter_dir).get("base_model_name_or_path")
    candidate = Path(base) if base is not None else Path(recorded) if recorded else None
    if candidate is None or not (candidate / "config.json").is_file():
        raise AdapterError(
            f"{adapter_dir}: its base model {candidate or '(not recorded)'} is not a model "
            "directory here; name the base model (--base)"
        )
    return candidate


def load_for_inference(adapter_dir: str | Path, base: str | Path | None = None, device: str = "cpu"):
    """Base + adapter merged into one plain transformers model (eval mode, fp32): what the searchers serve."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(base_of(adapter_dir, base)), dtype=torch.float32)
    merged = PeftModel.from_pretrained(model, str(adapter_dir)).merge_and_unload()
    return merged.to(device).eval()


def merge(adapter_dir: str | Path, out: str | Path, base: str | Path | None = None) -> Path:
    """Write base + adapter as one full Hugging Face model directory (weights, config, tokenizer) for serving.

    Written beside ``out`` and renamed into place: ``out`` appears complete or not at all."""
    import shutil

    from tba.model.tokenizer import load_tokenizer

    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise AdapterError(f"{out} exists and is not empty: choose a new output directory")
    base_dir = base_of(adapter_dir, base)
    model = load_for_inference(adapter_dir, base_dir)
    tmp = out.with_name(f".{out.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        model.save_pretrained(tmp, safe_serialization=True)
        load_tokenizer(base_dir).save_pretrained(tmp)
        if getattr(model, "generation_config", None) is not None:
            model.generation_config.save_pretrained(tmp)
        if out.exists():
            out.rmdir()
        tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out
