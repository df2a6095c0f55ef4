"""The reference model pi_ref: the base model, frozen, as both places that may score it load it.

Searchers (``TBA_REF_PASS=searcher``) and the trainer (``TBA_REF_PASS=trainer``, full fine-tuning) each
hold a copy; the loss needs log pi_ref(y|x) by exactly the definition the policy's log-probs use
(:mod:`tba.model.logprobs`), through the prefix-sharing pass, which needs attention that takes a 4D mask.
"""

from __future__ import annotations

from pathlib import Path

import torch


def load_reference_model(path: Path | str, dtype: str = "float32", device: str | torch.device = "cpu"):
    """The base model at ``path`` in eval mode, its parameters frozen, on ``device``."""
    from transformers import AutoModelForCausalLM

    from tba.model.logprobs import MASKED_ATTENTION, takes_tree_mask

    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=getattr(torch, dtype))
    model.to(device).eval()  # type: ignore[arg-type]  # transformers types .to as an unbound wrapper
    model.requires_grad_(False)
    if not takes_tree_mask(model):
        raise ValueError(
            f"{path}: the reference pass needs attention that takes a 4D mask "
            f"({' or '.join(MASKED_ATTENTION)}), this model loads with {model.config._attn_implementation!r}"
        )
    return model


def model_vocab_size(path: Path | str) -> int:
    """The vocabulary size of the model at ``path``, from its config alone (no weights loaded)."""
    from transformers import AutoConfig

    return int(AutoConfig.from_pretrained(str(path)).vocab_size)
