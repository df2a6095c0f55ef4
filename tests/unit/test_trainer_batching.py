"""Micro-batches by token budget: whole prompts only, and the same gradient as one big batch."""

from __future__ import annotations

import math
import random
from dataclasses import replace
from typing import Any

import pytest
import torch

from services.trainer.batching import Row, plan_micro_batches, rows_from_batch, staleness_histogram
from services.trainer.learner import Learner
from services.trainer.losses import make_loss
from services.trainer.optim import LRSchedule, build_optimizer
from tba.schemas import SampledBatch, SampledGroup, SampledSample


@pytest.fixture(autouse=True)
def _one_torch_thread():
    """Tiny models run fastest on one thread, and the CI cores are shared with other tests."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def make_rows(num_prompts: int = 6, K: int = 4, seed: int = 0) -> list[Row]:
    rng = random.Random(seed)
    rows = []
    for p in range(num_prompts):
        prompt = (1, *(rng.randrange(4, 80) for _ in range(rng.randint(2, 8))))
        for _ in range(K):
            completion = tuple(rng.randrange(4, 80) for _ in range(rng.randint(1, 9)))
            rows.append(
                Row(
                    ("arithmetic", f"p{p}"),
                    prompt,
                    completion,
                    float(rng.random() > 0.5),
                    -rng.uniform(5, 30),
                    version=rng.randint(0, 3),
                    staleness=rng.randint(0, 3),
                )
            )
    rng.shuffle(rows)
    return rows


@pytest.mark.parametrize("budget", [64, 100, 200, 10_000])
def test_plan_keeps_prompts_whole_and_respects_the_budget(budget: int) -> None:
    rows = make_rows()
    plan = plan_micro_batches(rows, budget)
    assert sum(mb.size for mb in plan) == len(rows)
    seen: dict[str, int] = {}
    for i, mb in enumerate(plan):
        groups = {}
        for prompt, idx in zip(mb.prompts, mb.prompt_index.tolist(), strict=True):
            groups.setdefault(idx, set()).add(tuple(prompt))
        assert all(len(v) == 1 for v in groups.values()), "one local index = one prompt"
        for idx in groups:
            key = f"{i}:{idx}"
            seen[key] = sum(1 for j in mb.prompt_index.tolist() if j == idx)
        lengths = [len(p) + len(c) for p, c in zip(mb.prompts, mb.completions, strict=True)]
        assert mb.padded_tokens == mb.size * max(lengths)
        if len(groups) > 1:
            assert mb.padded_tokens <= budget
    assert sorted(seen.values()) == [4] * 6, "every prompt's 4 samples sit in exactly one micro-batch"
    if budget == 10_000:
        assert len(plan) == 1


def test_plan_gives_an_oversize_prompt_its_own_micro_batch(caplog) -> None:
    rows = make_rows(num_prompts=3, K=8)
    plan = plan_micro_batches(rows, 64)
    assert len(plan) == 3 and all(mb.size == 8 for mb in plan)
    assert "over the budget" in caplog.text


def sampled_batch(groups: list[tuple[str, list[int], list[Any]]]) -> SampledBatch:
    """A batch of ``(prompt_id, prompt_ids, samples)`` groups; a sample is its completion ids, or the fields of
    a SampledSample that differ from the defaults here."""

    def sample(s: list[int] | dict[str, Any]) -> SampledSample:
        fields = {"completion_ids": s} if isinstance(s, list) else s
        defaults = {"reward": 1.0, "logprob_sum": -1.0, "ref_logprob_sum": -2.0, "version": 1, "staleness": 2}
        return SampledSample(**{**defaults, **fields})

    return SampledBatch(
        trainer_version=3,
        groups=[
            SampledGroup(
                prompt_id=pid, prompt_ids=prompt, task="arithmetic", branch="reward", samples=[sample(x) for x in xs]
            )
            for pid, prompt, xs in groups
        ],
    )


def test_rows_from_batch_merges_a_prompt_served_twice_and_drops_bad_groups() -> None:
    batch = sampled_batch(
        [
            ("a", [1, 5, 6], [[7, 2], [8, 2]]),
            ("b", [1, 9], [[7, 500]]),  # token id beyond the vocabulary
            ("a", [1, 5, 6], [[9, 2]]),  # the same prompt again: one log Z over 3 samples
            ("c", [1, 9], [[7] * 300]),  # longer than the model
            ("a", [1, 5, 7], [[9, 2]]),  # same id, other tokens: inconsistent
        ]
    )
    rows, problems = rows_from_batch(batch, vocab_size=92, max_length=256)
    assert len(rows) == 3 and {r.prompt_key for r in rows} == {("arithmetic", "a")}
    assert len(problems) == 3
    assert "vocabulary" in problems[0] and "exceeds" in problems[1] and "different prompt" in problems[2]
    plan = plan_micro_batches(rows, 10_000)
    assert plan[0].prompt_index.tolist() == [0, 0, 0]
    assert staleness_histogram(rows) == {2: 3}
    # Each sample's behaviour log-prob travels with it, for the importance weights.
    assert plan[0].log_behaviour.tolist() == [r.log_behaviour for r in rows] == [-1.0, -1.0, -1.0]
    # And the searcher that generated it, for its account (None where the buffer did not say).
    named = sampled_batch([("a", [1, 5], [{"completion_ids": [7, 2], "searcher_id": "s-1"}, [8, 2]])])
    assert [r.searcher_id for r in rows_from_batch(named, vocab_size=92, max_length=256)[0]] == ["s-1", None]


def grads_after_accumulate(
    model, rows, budget: int, loss: str = "tb", prefix_sharing: bool = True, reference=None, importance_clip=None
) -> torch.Tensor:
    optimizer, scheduler = build_optimizer(model, 1e-3, 0.0, LRSchedule())
    learner = Learner(
        model,
        optimizer,
        scheduler,
        make_loss(loss, importance_clip),
        temperature=0.7,
        pad_id=0,
        token_budget=budget,
        grad_clip=None,
        prefix_sharing=prefix_sharing,
        reference=reference,
    )
    model.zero_grad(set_to_none=True)
    learner.accumulate(plan_micro_batches(rows, budget), beta=0.1, denom=len(rows))
    return torch.cat([p.grad.flatten() for p in model.parameters()])


@pytest.mark.parametrize("loss", ["tb", "grpo"])
def test_micro_batching_and_shuffling_give_the_gradient_of_one_batch(tiny_model, loss: str) -> None:
    """Different budgets change the padding and the split; shuffling changes positions; prefix trees
    change the layout: same gradient."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(tiny_model), dtype=torch.float32)
    rows = make_rows(num_prompts=4, K=3)
    whole = grads_after_accumulate(model, rows, 100_000, loss)
    split = grads_after_accumulate(model, rows, 64, loss)
    shuffled = list(rows)
    random.Random(1).shuffle(shuffled)
    shuffled_split = grads_after_accumulate(model, shuffled, 90, loss)
    padded_rows = grads_after_accumulate(model, rows, 64, loss, prefix_sharing=False)
    assert whole.norm() > 0
    tol = 1e-5 * whole.abs().max().item()
    torch.testing.assert_close(split, whole, rtol=1e-4, atol=tol)
    torch.testing.assert_close(shuffled_split, whole, rtol=1e-4, atol=tol)
    torch.testing.assert_close(padded_rows, whole, rtol=1e-4, atol=tol)  # prefix trees or one row per sample


def test_padding_does_not_change_the_loss(tiny_model) -> None:
    """A long sequence in the same forward pads every other row by ~60 tokens: same log pi, same loss."""
    from transformers import AutoModelForCausalLM

    from services.trainer.losses import LossInput, tb_loss
    from tba.model.logprobs import sequence_logprobs

    model = AutoModelForCausalLM.from_pretrained(str(tiny_model), dtype=torch.float32)
    plan = plan_micro_batches(make_rows(num_prompts=2, K=3, seed=5), 100_000)[0]
    n = plan.size
    with torch.no_grad():
        alone = sequence_logprobs(model, plan.prompts, plan.completions, 0.7, 0)
        padded = sequence_logprobs(model, plan.prompts + [[1, 4, 5]], plan.completions + [list(range(10, 70))], 0.7, 0)[
            :n
        ]
    torch.testing.assert_close(padded, alone, rtol=1e-5, atol=1e-4)
    loss = [
        tb_loss(LossInput(lp, plan.log_ref, plan.reward, plan.prompt_index), 0.1).loss.item() for lp in (alone, padded)
    ]
    assert loss[1] == pytest.approx(loss[0], rel=1e-4)


def test_a_multi_turn_batch_trains_on_the_models_tokens_only(tiny_model) -> None:
    """A batch of two-turn trajectories (the environment's tokens as env_spans): the learner's gradient is
    the gradient of the TB loss written out on log-probs that sum the model's tokens only."""
    from transformers import AutoModelForCausalLM

    from tests.unit.test_logprobs import by_hand
    from tests.unit.test_losses import direct_tb

    model = AutoModelForCausalLM.from_pretrained(str(tiny_model), dtype=torch.float32)
    groups = [
        ("a", [1, 5, 6], [([7, 2, 40, 41, 9, 2], [[2, 4]]), ([7, 3, 40, 41, 8], [[2, 4]]), ([7, 2], None)]),
        ("b", [1, 9], [([12, 30, 31, 32, 13], [[1, 4]]), ([12, 30, 31, 32, 14, 2], [[1, 4]])]),
    ]
    rewards = {"a": [1.0, 0.0, 1.0], "b": [0.0, 1.0]}
    batch = sampled_batch(
        [
            (
                pid,
                prompt,
                [
                    {"completion_ids": c, "env_spans": spans, "reward": r, "ref_logprob_sum": -2.0 - i}
                    for i, ((c, spans), r) in enumerate(zip(samples, rewards[pid], strict=True))
                ],
            )
            for pid, prompt, samples in groups
        ]
    )
    rows, problems = rows_from_batch(batch, vocab_size=92, max_length=256)
    assert not problems and rows[0].env_spans == [[2, 4]] and rows[2].env_spans is None
    got = grads_after_accumulate(model, rows, 10_000)

    model.zero_grad(set_to_none=True)
    scored = [[True] * len(r.completion_ids) for r in rows]
    for r, flags in zip(rows, scored, strict=True):
        for start, end in r.env_spans or []:
            flags[start:end] = [False] * (end - start)
    log_pi = by_hand(model, [list(r.prompt_ids) for r in rows], [list(r.completion_ids) for r in rows], scored)
    _, dloss = direct_tb(
        log_pi.tolist(), [r.log_ref for r in rows], [r.reward for r in rows], [r.prompt_key[1] for r in rows], 0.1
    )
    (log_pi * torch.tensor(dloss)).sum().backward()  # the loss's gradient through log pi (log Z held constant)
    expected = torch.cat([p.grad.flatten() for p in model.parameters()])
    assert expected.norm() > 0
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5 * expected.abs().max().item())


def test_env_spans_that_do_not_fit_the_completion_drop_the_group() -> None:
    batch = sampled_batch([("a", [1, 5, 6], [[7, 2, 9]])])
    batch.groups[0].samples[0].env_spans = [[1, 5]]  # beyond the completion's 3 tokens
    rows, problems = rows_from_batch(batch, vocab_size=92, max_length=256)
    assert not rows and "env_spans" in problems[0]


def test_samples_without_a_reference_log_prob_are_dropped_unless_the_trainer_computes_it() -> None:
    batch = sampled_batch(
        [
            ("a", [1, 5, 6], [[7, 2], {"completion_ids": [8, 2], "ref_logprob_sum": None}]),
            ("b", [1, 9], [[7, 3]]),
        ]
    )
    rows, problems = rows_from_batch(batch, vocab_size=92, max_length=256)
    assert [r.prompt_key[1] for r in rows] == ["b"]
    assert len(problems) == 1 and "TBA_REF_PASS=trainer" in problems[0]
    rows, problems = rows_from_batch(batch, vocab_size=92, max_length=256, computes_ref=True)
    assert not problems and [r.log_ref for r in rows] == [-2.0, None, -2.0]
    assert torch.isnan(plan_micro_batches(rows, 10_000)[0].log_ref).sum() == 1


def test_the_trainers_reference_pass_gives_the_searchers_log_probs_and_gradient(tiny_model) -> None:
    """TBA_REF_PASS=trainer: rows without log pi_ref get it from a frozen copy of the base model, by the same
    definition the searchers use: the learner's gradient is the one it takes on rows the searchers scored.
    The policy is moved off the base first, so that a pass on the policy instead would show."""
    from transformers import AutoModelForCausalLM

    from services.trainer.reference import TrainerReference
    from tba.model.logprobs import sequence_logprobs

    model = AutoModelForCausalLM.from_pretrained(str(tiny_model), dtype=torch.float32)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.02)
    reference = TrainerReference(model, str(tiny_model), lora=False, device=torch.device("cpu"))
    assert not any(p.requires_grad for p in reference.frozen.parameters())
    rows = make_rows(num_prompts=4, K=3, seed=7)
    prompts, completions = [list(r.prompt_ids) for r in rows], [list(r.completion_ids) for r in rows]
    base = AutoModelForCausalLM.from_pretrained(str(tiny_model), dtype=torch.float32)
    with torch.no_grad():
        log_ref = sequence_logprobs(base, prompts, completions, 0.7, 0)
        assert (log_ref - sequence_logprobs(model, prompts, completions, 0.7, 0)).abs().max() > 1e-3
    scored = [replace(r, log_ref=float(v)) for r, v in zip(rows, log_ref, strict=True)]
    unscored = [replace(r, log_ref=None) for r in rows]
    optimizer, scheduler = build_optimizer(model, 1e-3, 0.0, LRSchedule())
    learner = Learner(
        model, optimizer, scheduler, make_loss("tb"), temperature=0.7, pad_id=0, token_budget=64, grad_clip=None,
        reference=reference,
    )  # fmt: skip
    by_pair = {(r.prompt_ids, r.completion_ids): float(v) for r, v in zip(rows, log_ref, strict=True)}
    plan = plan_micro_batches(unscored, 64)
    assert len(plan) > 1
    for mb in plan:  # each micro-batch's log pi_ref, in its own order, is the searchers' definition's
        pairs = zip(map(tuple, mb.prompts), map(tuple, mb.completions), strict=True)
        torch.testing.assert_close(learner.log_ref(mb), torch.tensor([by_pair[p] for p in pairs]), rtol=1e-5, atol=1e-4)
    expected = grads_after_accumulate(model, scored, 64)
    got = grads_after_accumulate(model, unscored, 64, reference=reference)
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5 * expected.abs().max().item())
    result = learner.step(unscored, beta=0.1)
    assert 0 < result.ref_seconds < result.seconds
    with pytest.raises(ValueError, match="no reference model"):
        grads_after_accumulate(model, unscored, 64)


def test_the_learner_weights_each_sample_by_its_policys_ratio_to_the_one_that_drew_it(tiny_model) -> None:
    """TBA_IMPORTANCE_CLIP: rows whose behaviour log-prob is the policy's own give plain TB's gradient; rows
    drawn by another policy give another, and the step reports their weights."""
    from transformers import AutoModelForCausalLM

    from tba.model.logprobs import sequence_logprobs

    model = AutoModelForCausalLM.from_pretrained(str(tiny_model), dtype=torch.float32)
    rows = make_rows(num_prompts=4, K=3, seed=8)
    prompts, completions = [list(r.prompt_ids) for r in rows], [list(r.completion_ids) for r in rows]
    with torch.no_grad():
        own = sequence_logprobs(model, prompts, completions, 0.7, 0)
    fresh = [replace(r, log_behaviour=float(v)) for r, v in zip(rows, own, strict=True)]
    plain = grads_after_accumulate(model, fresh, 64)
    weighted = grads_after_accumulate(model, fresh, 64, importance_clip=0.2)
    torch.testing.assert_close(weighted, plain, rtol=1e-4, atol=1e-5 * plain.abs().max().item())
    shift = torch.linspace(-0.5, 0.5, len(rows))  # some samples likelier now than when drawn, some less
    stale = [replace(r, log_behaviour=float(v - d)) for r, v, d in zip(rows, own, shift, strict=True)]
    moved = grads_after_accumulate(model, stale, 64, importance_clip=0.2)
    assert (moved - plain).abs().max() > 1e-3 * plain.abs().max()
    optimizer, scheduler = build_optimizer(model, 1e-3, 0.0, LRSchedule())
    learner = Learner(
        model, optimizer, scheduler, make_loss("tb", 0.2), temperature=0.7, pad_id=0, token_budget=64, grad_clip=None
    )
    metrics = learner.step(stale, beta=0.1).metrics
    want = torch.exp(shift.double()).clamp(0.8, 1.2).mean().item()
    assert metrics["importance_weight_mean"] == pytest.approx(want, rel=1e-3)
    clipped = ((shift > math.log1p(0.2)) | (shift < math.log1p(-0.2))).double().mean().item()
    assert 0 < clipped < 1 and metrics["importance_clipped"] == pytest.approx(clipped)
