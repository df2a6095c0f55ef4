"""Summed completion log-probabilities under temperature-scaled logits.

The one definition of log pi(y|x) in the project: the trainer calls it on the
policy (with gradients), the searcher on the reference model (without), so the
two sides of the TB loss are computed the same way (ALGORITHM.md §2). Padding
is masked out of the sums, so the result does not depend on batch padding.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def pad_batch(
    prompts: Sequence[Sequence[int]], completions: Sequence[Sequence[int]], pad_id: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded ``input_ids``, ``attention_mask`` and completion mask, each (N, L)."""
    seqs = [list(p) + list(c) for p, c in zip(prompts, completions, strict=True)]
    L = max(len(s) for s in seqs)
    N = len(seqs)
    input_ids = torch.full((N, L), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((N, L), dtype=torch.long)
    completion_mask = torch.zeros((N, L), dtype=torch.bool)
    for i, (p, s) in enumerate(zip(prompts, seqs, strict=True)):
        input_ids[i, : len(s)] = torch.tensor(s, dtype=torch.long)
        attention_mask[i, : len(s)] = 1
        completion_mask[i, len(p) : len(s)] = True
    return input_ids, attention_mask, completion_mask


def token_logprobs(
    model: torch.nn.Module,
    prompts: Sequence[Sequence[int]],
    completions: Sequence[Sequence[int]],
    temperature: float,
    pad_id: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token log-probs of each completion token, (N, L-1), and their mask (N, L-1)."""
    device = next(model.parameters()).device
    input_ids, attention_mask, completion_mask = pad_batch(prompts, completions, pad_id)
    input_ids, attention_mask = input_ids.to(device), attention_mask.to(device)
    logits = model(input_ids=input_ids, attention_mask=attention_mask).logits[:, :-1]  # (N, L-1, V)
    logp = torch.log_softmax(logits.float() / temperature, dim=-1)
    targets = input_ids[:, 1:]  # token t+1 is predicted at position t
    tok_logp = logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1)  # (N, L-1)
    mask = completion_mask[:, 1:].to(device)
    return tok_logp.masked_fill(~mask, 0.0), mask


def sequence_logprobs(
    model: torch.nn.Module,
    prompts: Sequence[Sequence[int]],
    completions: Sequence[Sequence[int]],
    temperature: float,
    pad_id: int,
) -> torch.Tensor:
    """log pi(y_i | x_i) summed over completion tokens, shape (N,)."""
    tok_logp, _ = token_logprobs(model, prompts, completions, temperature, pad_id)
    return tok_logp.sum(dim=-1)
