"""Padded batches and packing under a token budget (tba/model/batches.py)."""

from __future__ import annotations

import torch
from hypothesis import given
from hypothesis import strategies as st

from tba.model.batches import pad, pad_batch, token_budget_chunks


def test_pad_right_and_left() -> None:
    ids, mask = pad([[5, 6, 7], [8], []], pad_id=0)
    assert ids.tolist() == [[5, 6, 7], [8, 0, 0], [0, 0, 0]]
    assert mask.tolist() == [[1, 1, 1], [1, 0, 0], [0, 0, 0]]
    ids, mask = pad([[5, 6, 7], [8], []], pad_id=0, left=True)
    assert ids.tolist() == [[5, 6, 7], [0, 0, 8], [0, 0, 0]]
    assert mask.tolist() == [[1, 1, 1], [0, 0, 1], [0, 0, 0]]
    assert ids.dtype == mask.dtype == torch.long


def test_pad_batch_marks_the_completion_tokens() -> None:
    ids, mask, completion = pad_batch([[1, 2], [3]], [[4], [5, 6, 7]], pad_id=9)
    assert ids.tolist() == [[1, 2, 4, 9], [3, 5, 6, 7]]
    assert mask.tolist() == [[1, 1, 1, 0], [1, 1, 1, 1]]
    assert completion.tolist() == [[False, False, True, False], [False, True, True, True]]


@given(st.lists(st.integers(1, 300), min_size=0, max_size=200), st.integers(64, 4096))
def test_chunks_cover_every_row_once_within_budget(lengths: list[int], budget: int) -> None:
    chunks = token_budget_chunks(lengths, budget)
    flat = [i for c in chunks for i in c]
    assert sorted(flat) == list(range(len(lengths)))
    for c in chunks:
        padded = len(c) * max(lengths[i] for i in c)
        assert padded <= budget or len(c) == 1  # a single over-long row still gets its own pass


def test_chunks_group_similar_lengths() -> None:
    chunks = token_budget_chunks([100, 5, 100, 5], budget=200)
    assert sorted(map(sorted, chunks)) == [[0, 2], [1, 3]]


@given(st.lists(st.tuples(st.integers(1, 300), st.integers(1, 8)), max_size=60), st.integers(64, 4096))
def test_items_of_several_rows_stay_whole_longest_first(items: list[tuple[int, int]], budget: int) -> None:
    lengths, rows = [n for n, _ in items], [r for _, r in items]
    chunks = token_budget_chunks(lengths, budget, rows=rows, longest_first=True)
    flat = [i for c in chunks for i in c]
    assert sorted(flat) == list(range(len(items)))
    assert [lengths[i] for i in flat] == sorted(lengths, reverse=True)
    for c in chunks:
        padded = sum(rows[i] for i in c) * max(lengths[i] for i in c)
        assert padded <= budget or len(c) == 1
