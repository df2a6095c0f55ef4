"""Batched decoding with transformers and a KV cache, for evaluation on the CPU.

The searchers generate with vLLM; evaluation (``tba eval``, the SFT stopping
test, the end-to-end report) decodes with this small loop instead, so it runs
in the calling process without an engine start. Prompts are left-padded and
given explicit position ids, so a prompt decodes the same whatever its batch
neighbours; a row ends at any of the model's EOS tokens (instruction-tuned models
often have several: :func:`eos_ids`), and the whole batch stops as soon as every
row has ended.
Sampling draws from softmax(logits / T), the tempered policy the TB loss trains
(docs/algorithm.md §3).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any

import torch

from tba.model.batches import pad


def eos_ids(model: Any, tokenizer: Any) -> list[int]:
    """Every token that ends a completion: the tokenizer's EOS and the generation config's (vLLM stops on both)."""
    ids = {tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else set()
    configured = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    ids |= set(configured) if isinstance(configured, list | tuple) else {configured} - {None}
    return sorted(ids)


def _as_set(eos_id: int | Collection[int]) -> set[int]:
    return {eos_id} if isinstance(eos_id, int) else set(eos_id)


def _next_tokens(logits: torch.Tensor, temperature: float, generator: torch.Generator | None) -> torch.Tensor:
    """Greedy argmax when temperature == 0, else a draw from softmax(logits / T); logits (B, V)."""
    if temperature == 0.0:
        return logits.argmax(dim=-1)
    probs = torch.softmax(logits.float() / temperature, dim=-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


@torch.no_grad()
def _generate_batch(
    model: torch.nn.Module,
    prompts: Sequence[Sequence[int]],
    max_new_tokens: int,
    eos_id: int | Collection[int],
    pad_id: int,
    temperature: float,
    generator: torch.Generator | None,
) -> list[list[int]]:
    device = next(model.parameters()).device
    eos = _as_set(eos_id)
    eos_t = torch.tensor(sorted(eos), dtype=torch.long, device=device)
    input_ids, attention_mask = pad(prompts, pad_id, left=True)
    input_ids, attention_mask = input_ids.to(device), attention_mask.to(device)
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)  # (B, L): real tokens count from 0
    B = input_ids.shape[0]
    out = torch.full((B, max_new_tokens), pad_id, dtype=torch.long, device=device)
    done = torch.zeros(B, dtype=torch.bool, device=device)
    past = None
    step_ids, step_pos = input_ids, position_ids
    steps = 0
    for t in range(max_new_tokens):
        res = model(
            input_ids=step_ids,
            attention_mask=attention_mask,
            position_ids=step_pos,
            past_key_values=past,
            use_cache=True,
        )
        past = res.past_key_values
        tok = _next_tokens(res.logits[:, -1], temperature, generator)  # (B,)
        tok = tok.masked_fill(done, pad_id)
        out[:, t] = tok
        steps = t + 1
        done |= torch.isin(tok, eos_t)
        if bool(done.all()):
            break
        step_ids = tok.unsqueeze(-1)
        step_pos = step_pos[:, -1:] + 1
        attention_mask = torch.cat([attention_mask, torch.ones((B, 1), dtype=attention_mask.dtype, device=device)], 1)
    completions = []
    for row in out[:, :steps].tolist():
        # A row ends at its first EOS (kept); one that never emitted it ran every step.
        end = next((i for i, tok in enumerate(row) if tok in eos), None)
        completions.append(row if end is None else row[: end + 1])
    return completions


def generate(
    model: torch.nn.Module,
    prompts: Sequence[Sequence[int]],
    *,
    max_new_tokens: int,
    eos_id: int | Collection[int],
    pad_id: int,
    temperature: float = 0.0,
    seed: int | None = None,
    batch_size: int = 256,
) -> list[list[int]]:
    """Completion token ids for each prompt (EOS included when emitted); greedy when ``temperature`` is 0.

    ``batch_size`` bounds memory; results do not depend on it for greedy decoding.
    """
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    generator = None
    if temperature > 0:
        generator = torch.Generator(device=next(model.parameters()).device)
        generator.manual_seed(0 if seed is None else seed)
    was_training = model.training
    model.eval()
    try:
        out: list[list[int]] = []
        for start in range(0, len(prompts), batch_size):
            chunk = prompts[start : start + batch_size]
            out.extend(_generate_batch(model, chunk, max_new_tokens, eos_id, pad_id, temperature, generator))
        return out
    finally:
        model.train(was_training)


def strip_eos(ids: Sequence[int], eos_id: int | Collection[int]) -> list[int]:
    """Completion ids without the trailing EOS (what rewards and answer text are computed on)."""
    ids = list(ids)
    return ids[:-1] if ids and ids[-1] in _as_set(eos_id) else ids
