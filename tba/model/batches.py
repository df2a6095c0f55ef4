"""Token-id sequences of different lengths as one model input, and sequences packed under a token budget.

Every padded batch in the project is laid out by :func:`pad`: the trainer's and the reference's
log-probs (:func:`pad_batch`), SFT, evaluation's left-padded prompts, the prefix trees' rows and
the judge's inputs, so padding and its mask mean the same everywhere. Every pass that bounds its
memory by padded tokens (rows x the longest row, what a forward pass allocates) is planned by
:func:`token_budget_chunks`: the reference pass over prefix trees and the trainer's micro-batches.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def pad(seqs: Sequence[Sequence[int]], pad_id: int, left: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """``input_ids`` and ``attention_mask`` (1 on real tokens), each (N, longest), long.

    Right-padded, or left-padded (``left``) for decoding, where every row's last token must be its newest."""
    L = max(len(s) for s in seqs)
    input_ids = torch.full((len(seqs), L), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((len(seqs), L), dtype=torch.long)
    for i, s in enumerate(seqs):
        if s:
            span = slice(L - len(s), L) if left else slice(0, len(s))
            input_ids[i, span] = torch.tensor(list(s), dtype=torch.long)
            attention_mask[i, span] = 1
    return input_ids, attention_mask


def pad_batch(
    prompts: Sequence[Sequence[int]], completions: Sequence[Sequence[int]], pad_id: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Prompt + completion rows, right-padded: ``input_ids``, ``attention_mask`` and the completion mask (bool),
    each (N, L)."""
    input_ids, attention_mask = pad([list(p) + list(c) for p, c in zip(prompts, completions, strict=True)], pad_id)
    starts = torch.tensor([len(p) for p in prompts], dtype=torch.long)
    completion_mask = attention_mask.bool() & (torch.arange(input_ids.shape[1]) >= starts[:, None])
    return input_ids, attention_mask, completion_mask


def token_budget_chunks(
    lengths: Sequence[int], budget: int, rows: Sequence[int] | None = None, longest_first: bool = False
) -> list[list[int]]:
    """Indices grouped so each chunk's padded size (rows x longest) stays within ``budget`` tokens.

    Item ``i`` brings ``rows[i]`` rows (1 each by default) of at most ``lengths[i]`` tokens; items stay
    whole, so one larger than the budget gets a chunk of its own. Items are taken in order of length
    (``longest_first``: descending), so the rows of a chunk pad to similar lengths."""
    rows = rows if rows is not None else [1] * len(lengths)
    order = sorted(range(len(lengths)), key=lambda i: lengths[i], reverse=longest_first)
    chunks: list[list[int]] = []
    n_rows, longest = 0, 0
    for i in order:
        if not chunks or (n_rows + rows[i]) * max(longest, lengths[i]) > budget:
            chunks.append([])
            n_rows, longest = 0, 0
        chunks[-1].append(i)
        n_rows, longest = n_rows + rows[i], max(longest, lengths[i])
    return chunks
