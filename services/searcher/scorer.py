"""Scoring a generated batch: task rewards and reference log-probs, assembled into ScoredGroups.

log pi_ref(y|x) is the quantity :func:`tba.model.logprobs.sequence_logprobs`
computes on the reference model (the base model at ``settings.model``): under
logits/T, over exactly the completion ids the engine returned (EOS included
when emitted), the same ids and masking the trainer uses for log pi_theta, so
the two sides of the TB loss agree (docs/algorithm.md §3), by the prefix-sharing pass
of :mod:`services.searcher.reference`. While the engine still serves the base
weights (version 0, before the first checkpoint: the warm-up that fills the
buffer) the policy IS the reference, and vLLM's own tempered log-probs are
reused instead of a second pass (``ref_reuse_at_base``). With ``TBA_REF_PASS=trainer`` the scorer holds
no reference model and sends the other samples without log pi_ref: the trainer computes it. Rewards see
the decoded text without special tokens (no EOS).

The scorer also owns how a prompt becomes token ids (:attr:`Scorer.prompt_format`:
plain, or the model's chat template when the task is in chat form), so the ids
generated from are the ids every group carries to the trainer.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass

from services.searcher.engine import Completion
from services.searcher.reference import Reference
from tba.checkpoints import model_identity
from tba.model.reference import model_vocab_size
from tba.model.tokenizer import PromptFormat, load_tokenizer
from tba.schemas import MAX_ABS_LOGPROB, MAX_ABS_REWARD, ScoredGroup, ScoredSample, scored_flags
from tba.settings import SearcherSettings
from tba.tasks import Prompt, Task

log = logging.getLogger(__name__)


@dataclass
class GeneratedBatch:
    """What one ``generate`` call produced, with the policy version that produced it."""

    prompts: list[Prompt]
    prompt_ids: list[list[int]]
    completions: list[list[Completion]]  # (P, S)
    version: int
    ref_is_policy: bool = False  # generated with the reference (base) weights themselves

    @property
    def samples(self) -> int:
        return sum(len(group) for group in self.completions)


class Scorer:
    """Holds the reference model and the task; turns a :class:`GeneratedBatch` into ScoredGroups."""

    def __init__(
        self, settings: SearcherSettings, task: Task, searcher_id: str, reference: Reference | None = None
    ) -> None:
        self.settings = settings
        self.task = task
        self.searcher_id = searcher_id
        self.temperature = settings.temperature
        self.tokenizer = load_tokenizer(settings.model)
        if task.chat and not self.tokenizer.chat_template:
            raise ValueError(f"task {task.name!r} is in chat form but {settings.model} has no chat template")
        self.prompt_format = PromptFormat(chat=task.chat, system_prompt=settings.system_prompt)
        self.pad_id = self.tokenizer.pad_token_id
        if self.pad_id is None:
            self.pad_id = self.tokenizer.eos_token_id  # masked out of the sums either way
        # TBA_REF_PASS=trainer: no reference here, the samples go out without log pi_ref.
        self.reference = reference
        if self.reference is None and settings.ref_pass == "searcher":
            self.reference = Reference(settings, self.pad_id)
        self.vocab_size = model_vocab_size(settings.model)  # the ids the trainer's model takes
        self.reference_id = model_identity(settings.model)  # stamped on every group: the buffer checks the objective
        self.dropped = 0
        self.ref_pairs_total = self.ref_pairs_scored = 0  # pairs asked for, distinct pairs the reference scored

    def ref_logprobs(
        self,
        prompt_ids: Sequence[Sequence[int]],
        completion_ids: Sequence[Sequence[int]],
        env_spans: Sequence[list[list[int]] | None] | None = None,
    ) -> list[float]:
        """log pi_ref(y_i|x_i) under logits/T for each pair, over the model's tokens only (``env_spans``:
        a multi-turn trajectory's environment tokens, per pair).

        Each distinct (prompt, completion) pair is scored once: a policy that has learned a prompt
        samples the same completion many times over (most of a batch, late in a run)."""
        spans = env_spans if env_spans is not None else [None] * len(prompt_ids)
        index: dict[tuple[tuple[int, ...], tuple[int, ...], tuple[tuple[int, ...], ...]], int] = {}
        slots = [
            index.setdefault((tuple(p), tuple(c), tuple(map(tuple, e or []))), len(index))
            for p, c, e in zip(prompt_ids, completion_ids, spans, strict=True)
        ]
        self.ref_pairs_total += len(slots)
        self.ref_pairs_scored += len(index)
        if not index:
            return []
        if self.reference is None:
            raise RuntimeError("TBA_REF_PASS=trainer: this searcher holds no reference model")
        unique = list(index)
        scored = scored_flags([len(c) for _, c, _ in unique], [[list(e) for e in es] for _, _, es in unique])
        values = self.reference.logprobs([p for p, _, _ in unique], [c for _, c, _ in unique], scored)
        return [values[i] for i in slots]

    def score(self, batch: GeneratedBatch) -> list[ScoredGroup]:
        """Rewards, reference log-probs and the group envelope for every prompt of the batch."""
        flat = [(p, c) for p, group in enumerate(batch.completions) for c in group if self._usable(c)]
        if not flat:  # every episode of the batch failed (the tokenizer decodes an empty list as one text)
            return []
        ref: Sequence[float | None]  # None: the trainer computes it
        if batch.ref_is_policy:
            # pi_theta is pi_ref here: vLLM's tempered log-probs over the same ids ARE log pi_ref(y|x).
            ref = [c.logprob_sum for _, c in flat]
        elif self.reference is None:
            ref = [None] * len(flat)
        else:
            ref = self.ref_logprobs(
                [batch.prompt_ids[p] for p, _ in flat], [c.token_ids for _, c in flat], [c.env_spans for _, c in flat]
            )
        texts = self.tokenizer.batch_decode([c.token_ids for _, c in flat], skip_special_tokens=True)
        per_prompt: list[list[tuple[Completion, float | None, str]]] = [[] for _ in batch.prompts]
        for (p, c), r, text in zip(flat, ref, texts, strict=True):
            per_prompt[p].append((c, r, text))
        groups = []
        for prompt, ids, items in zip(batch.prompts, batch.prompt_ids, per_prompt, strict=True):
            if not items:
                continue
            # A multi-turn environment's own reward where it gave one, else the task's reward of the text.
            unscored = [i for i, (c, _, _) in enumerate(items) if c.reward is None]
            by_task = self.task.rewards(prompt, [items[i][2] for i in unscored]) if unscored else []
            task_reward = dict(zip(unscored, by_task, strict=True))
            rewards = [task_reward[i] if c.reward is None else c.reward for i, (c, _, _) in enumerate(items)]
            samples = [
                ScoredSample(
                    completion_ids=c.token_ids,
                    completion_text=text,
                    reward=reward,
                    logprob_sum=c.logprob_sum,
                    ref_logprob_sum=r,
                    finish_reason=c.finish_reason,
                    token_logprobs=c.token_logprobs,
                    env_spans=c.env_spans,
                )
                for (c, r, text), reward in zip(items, rewards, strict=True)
                if self._in_bounds(reward=(reward, MAX_ABS_REWARD), ref_logprob_sum=(r, MAX_ABS_LOGPROB))
            ]
            if not samples:
                continue
            groups.append(
                ScoredGroup(
                    prompt_id=prompt.prompt_id,
                    prompt_text=prompt.text,
                    prompt_ids=ids,
                    task=self.task.name,
                    policy_version=batch.version,
                    searcher_id=self.searcher_id,
                    samples=samples,
                    temperature=self.temperature,
                    reference=self.reference_id,
                )
            )
        return groups

    def _in_bounds(self, **values: tuple[float | None, float]) -> bool:
        """Each value (None: not computed here) finite and within its bound (the wire's, tba.schemas): the
        buffer would refuse the group."""
        bad = {k: v for k, (v, limit) in values.items() if v is not None and not (math.isfinite(v) and abs(v) <= limit)}
        if bad:
            self.dropped += 1
            log.warning("dropping a completion with %s out of bounds", bad)
        return not bad

    def _usable(self, c: Completion) -> bool:
        """The loss cannot use an empty or aborted completion, one without a finite log-prob, or one with a
        token id the model has no embedding for."""
        ok = (
            c.token_ids
            and c.finish_reason in ("stop", "length")
            and math.isfinite(c.logprob_sum)
            and abs(c.logprob_sum) <= MAX_ABS_LOGPROB
        )
        if ok and 0 <= min(c.token_ids) and max(c.token_ids) < self.vocab_size:
            return True
        self.dropped += 1
        if ok:
            log.warning(
                "dropping a completion with token ids outside the vocabulary [0, %d): %s",
                self.vocab_size,
                [t for t in c.token_ids if not 0 <= t < self.vocab_size][:5],
            )
        else:
            log.warning(
                "dropping a completion the loss cannot use (%d tokens, log-prob %s, finish %s)",
                len(c.token_ids),
                c.logprob_sum,
                c.finish_reason,
            )
        return False
