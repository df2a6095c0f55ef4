"""From a sampled batch to micro-batches of complete prompts under a token budget.

log Z is a per-prompt mean over that prompt's K samples (docs/algorithm.md §2), so a
prompt is never split across micro-batches: each micro-batch holds whole
prompts, its loss is exact, and gradient accumulation over micro-batches gives
the gradient of the whole batch. The budget counts padded tokens (rows × the
longest row), which is what the forward pass allocates. A single prompt whose K
samples exceed the budget gets a micro-batch of its own: memory stays bounded
by max(budget, K × longest sequence).

Samples are grouped by (task, prompt id), not by group: if the buffer serves the
same prompt in two slots, both groups feed one log Z estimate.
"""

from __future__ import annotations

import logging
import math
from collections import Counter
from dataclasses import dataclass

import torch

from tba.model.batches import token_budget_chunks
from tba.schemas import SampledBatch, check_env_spans, scored_flags

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Row:
    """One sample as the loss needs it."""

    prompt_key: tuple[str, str]  # (task, prompt_id)
    prompt_ids: tuple[int, ...]
    completion_ids: tuple[int, ...]
    reward: float
    log_ref: float | None  # None: the trainer computes it (TBA_REF_PASS=trainer)
    version: int
    staleness: int
    env_spans: list[list[int]] | None = None  # multi-turn: the environment's tokens of the completion
    log_behaviour: float = math.nan  # log mu(y|x): the generating policy's log-prob, as its searcher sent it
    searcher_id: str | None = None  # the searcher that generated it (None: the buffer did not say)

    @property
    def length(self) -> int:
        return len(self.prompt_ids) + len(self.completion_ids)


@dataclass
class MicroBatch:
    prompts: list[list[int]]
    completions: list[list[int]]
    log_ref: torch.Tensor  # (n,); NaN where the trainer computes it
    log_behaviour: torch.Tensor  # (n,); NaN where unknown
    reward: torch.Tensor  # (n,)
    prompt_index: torch.Tensor  # (n,) long, local to this micro-batch
    tokens: int  # real (unpadded) tokens
    padded_tokens: int
    scored: list[list[bool]] | None = None  # per completion, which tokens are the model's (None: all of them)

    @property
    def size(self) -> int:
        return len(self.prompts)


def rows_from_batch(
    batch: SampledBatch, vocab_size: int, max_length: int, computes_ref: bool = False
) -> tuple[list[Row], list[str]]:
    """Rows the model can take, and one reason per group dropped (bad ids, too long, inconsistent prompt,
    no reference log-prob where the trainer does not compute it: ``computes_ref``)."""
    rows: list[Row] = []
    problems: list[str] = []
    prompt_tokens: dict[tuple[str, str], tuple[int, ...]] = {}
    for gi, group in enumerate(batch.groups):
        key = (group.task, group.prompt_id)
        prompt_ids = tuple(group.prompt_ids)
        reason = _check_group(group, prompt_ids, vocab_size, max_length, computes_ref)
        if reason is None and prompt_tokens.setdefault(key, prompt_ids) != prompt_ids:
            reason = "same prompt id as another group but different prompt token ids"
        if reason is not None:
            problems.append(f"group {gi} (prompt {group.prompt_id!r}): {reason}")
            continue
        for s in group.samples:
            rows.append(
                Row(
                    key,
                    prompt_ids,
                    tuple(s.completion_ids),
                    s.reward,
                    s.ref_logprob_sum,
                    s.version,
                    s.staleness,
                    s.env_spans,
                    s.logprob_sum,
                    s.searcher_id,
                )
            )
    return rows, problems


def _check_group(
    group, prompt_ids: tuple[int, ...], vocab_size: int, max_length: int, computes_ref: bool
) -> str | None:
    if not prompt_ids or not group.samples:
        return "empty prompt or no samples"
    for s in group.samples:
        if s.ref_logprob_sum is None and not computes_ref:
            return "no reference log-prob: its searcher runs with TBA_REF_PASS=trainer, this trainer does not"
        ids = prompt_ids + tuple(s.completion_ids)
        if not s.completion_ids:
            return "empty completion"
        if min(ids) < 0 or max(ids) >= vocab_size:
            return f"token id outside the vocabulary [0, {vocab_size})"
        if len(ids) > max_length:
            return f"sequence of {len(ids)} tokens exceeds the model's {max_length} positions"
        try:
            check_env_spans(s.env_spans, len(s.completion_ids))
        except ValueError as err:
            return str(err)
    return None


def group_by_prompt(rows: list[Row]) -> dict[tuple[str, str], list[Row]]:
    """The batch's rows per prompt (a TB group), in first-seen order."""
    by_prompt: dict[tuple[str, str], list[Row]] = {}
    for row in rows:
        by_prompt.setdefault(row.prompt_key, []).append(row)
    return by_prompt


def plan_micro_batches(rows: list[Row], token_budget: int) -> list[MicroBatch]:
    """Pack whole prompts, longest first, into micro-batches of at most ``token_budget`` padded tokens."""
    units = list(group_by_prompt(rows).values())
    longest = [max(r.length for r in unit) for unit in units]
    plans = token_budget_chunks(longest, token_budget, rows=[len(u) for u in units], longest_first=True)
    for plan in plans:
        first = plan[0]  # a prompt over the budget is alone in its micro-batch
        if len(units[first]) * longest[first] > token_budget:
            log.warning(
                "one prompt's %d samples need %d padded tokens, over the budget of %d: "
                "it gets a micro-batch of its own (log Z needs all of them)",
                len(units[first]),
                len(units[first]) * longest[first],
                token_budget,
            )
    return [_collate([units[i] for i in plan]) for plan in plans]


def _collate(units: list[list[Row]]) -> MicroBatch:
    rows = [r for unit in units for r in unit]
    index = [gi for gi, unit in enumerate(units) for _ in unit]
    return MicroBatch(
        prompts=[list(r.prompt_ids) for r in rows],
        completions=[list(r.completion_ids) for r in rows],
        log_ref=torch.tensor([math.nan if r.log_ref is None else r.log_ref for r in rows], dtype=torch.float32),
        log_behaviour=torch.tensor([r.log_behaviour for r in rows], dtype=torch.float32),
        reward=torch.tensor([r.reward for r in rows], dtype=torch.float32),
        prompt_index=torch.tensor(index, dtype=torch.long),
        tokens=sum(r.length for r in rows),
        padded_tokens=len(rows) * max(r.length for r in rows),
        scored=scored_flags([len(r.completion_ids) for r in rows], [r.env_spans for r in rows]),
    )


def staleness_histogram(rows: list[Row]) -> dict[int, int]:
    """How many samples of the batch are 0, 1, 2, ... versions behind the trainer."""
    return dict(sorted(Counter(r.staleness for r in rows).items()))
