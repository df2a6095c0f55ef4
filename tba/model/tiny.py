"""The tiny Llama-architecture policy the CPU runs use (``tba model init``).

head_dim is 64 because vLLM's CPU attention kernel rejects smaller heads
(docs/operations.md §7). Weights are fp32 and saved in Hugging Face format with the
tokenizer and a generation config, so transformers and vLLM load the directory
as they would any hub model.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class TinyModelSpec:
    hidden_size: int = 256
    num_layers: int = 4
    num_heads: int = 4
    intermediate_size: int = 768
    max_position_embeddings: int = 256

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads


def init_model(out_dir: str | Path, spec: TinyModelSpec = TinyModelSpec(), seed: int = 0) -> Path:
    """Write a freshly initialised tiny Llama and its tokenizer to ``out_dir``."""
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    from tba.model.tokenizer import build_tokenizer

    if spec.head_dim != 64:
        raise ValueError(f"head_dim must be 64 for vLLM's CPU kernel, got {spec.head_dim}")
    tok = build_tokenizer()
    config = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_layers,
        num_attention_heads=spec.num_heads,
        num_key_value_heads=spec.num_heads,
        head_dim=spec.head_dim,
        max_position_embeddings=spec.max_position_embeddings,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        tie_word_embeddings=False,
        dtype="float32",
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
    GenerationConfig(
        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id
    ).save_pretrained(out)
    return out
