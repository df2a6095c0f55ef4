"""A real pretrained model through the searcher and the trainer: SmolLM2-135M-Instruct with the real vLLM CPU engine.

What the tiny model never exercised: a BPE tokenizer with a chat template and special tokens, EOS that
is not the tiny model's, completions of hundreds of tokens, grouped-query attention, tied embeddings,
a 538 MB checkpoint reloaded in place. One engine for the module (its start costs half a minute).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from services.searcher.engine import Engine
from services.searcher.scorer import GeneratedBatch, Scorer
from services.trainer.batching import Row
from services.trainer.checkpointing import TrainerState, save_checkpoint
from services.trainer.learner import Learner
from services.trainer.losses import make_loss
from services.trainer.optim import LRSchedule, build_optimizer
from tba.checkpoints import CheckpointStore
from tba.model.logprobs import sequence_logprobs
from tba.settings import SearcherSettings
from tba.tasks import Prompt, make_task

pytestmark = [pytest.mark.slow, pytest.mark.vllm]

T = 0.7
MAX_NEW = 256
EOS = 2  # <|im_end|>
QUESTIONS = [
    "What is 37+45? Answer with the number only.",
    "What is 12+61? Answer with the number only.",
    "Write a short story about a robot who learns to paint.",
]


def hf_model(path: Path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def parts(smollm2: Path, tmp_path_factory: pytest.TempPathFactory):
    tmp = tmp_path_factory.mktemp("real")
    settings = SearcherSettings(
        model=smollm2,
        redis_url="redis://127.0.0.1:1/0",
        namespace="t",
        checkpoint_dir=tmp / "ckpt",
        spill_dir=tmp / "spill",
        searcher_id="s-real",
        completions_per_prompt=4,
        prompts_per_batch=3,
        max_new_tokens=MAX_NEW,
        max_model_len=512,
        temperature=T,
        kv_cache_gib=1,
        generation_dtype="float32",  # compared with the trainer's float32 computation
    )
    task = make_task("arithmetic", chat=True)
    scorer = Scorer(settings, task, settings.searcher_id)
    engine = Engine(settings, smollm2, version=0, seed=0)
    yield engine, scorer, settings
    engine.close()


def prompts_and_ids(scorer: Scorer) -> tuple[list[Prompt], list[list[int]]]:
    prompts = [Prompt(f"q{i}", q, "82" if "37+45" in q else "73") for i, q in enumerate(QUESTIONS)]
    return prompts, [scorer.prompt_format.encode(scorer.tokenizer, p.text) for p in prompts]


def test_prompt_ids_are_the_chat_templates_including_special_tokens(parts) -> None:
    _engine, scorer, _settings = parts
    tok = scorer.tokenizer
    _, ids = prompts_and_ids(scorer)
    for question, prompt_ids in zip(QUESTIONS, ids, strict=True):
        expected = tok.apply_chat_template(
            [{"role": "user", "content": question}], add_generation_prompt=True, tokenize=True, return_dict=False
        )
        assert prompt_ids == list(expected)
        assert prompt_ids[0] == 1 and prompt_ids.count(EOS) == 2  # <|im_start|> ... <|im_end|>: system, user


def test_long_completions_end_at_eos_and_score_as_the_trainer_computes(parts, smollm2: Path) -> None:
    engine, scorer, settings = parts
    prompts, ids = prompts_and_ids(scorer)
    batch = GeneratedBatch(prompts, ids, engine.generate(ids, engine.sampling_params(4, T, MAX_NEW)), version=1)
    groups = scorer.score(batch)  # version 1 (not the base weights' own): the reference pass runs
    samples = [s for g in groups for s in g.samples]
    assert len(groups) == 3 and len(samples) == 12
    for s in samples:
        assert 1 <= len(s.completion_ids) <= MAX_NEW
        if s.finish_reason == "stop":
            assert s.completion_ids[-1] == EOS and EOS not in s.completion_ids[:-1]
        else:
            assert s.finish_reason == "length" and len(s.completion_ids) == MAX_NEW
        assert "<|im_end|>" not in s.completion_text  # rewards read the text without special tokens
    assert max(len(s.completion_ids) for s in groups[2].samples) > 64, "the story should run long"
    assert all(g.prompt_ids == i for g, i in zip(groups, ids, strict=True))
    # The trainer's side on a fresh load of the base (= reference) model: the shared log-prob function.
    prompt_ids = [g.prompt_ids for g in groups for _ in g.samples]
    completion_ids = [s.completion_ids for s in samples]
    with torch.no_grad():
        expected = sequence_logprobs(hf_model(smollm2), prompt_ids, completion_ids, T, scorer.pad_id)
    ref = torch.tensor([s.ref_logprob_sum for s in samples])
    torch.testing.assert_close(ref, expected, atol=2e-3, rtol=1e-4)
    # vLLM's behaviour log-probs at the base weights: the same policy, computed by other kernels.
    behaviour = torch.tensor([s.logprob_sum for s in samples])
    torch.testing.assert_close(behaviour, expected, atol=2e-3, rtol=1e-4)
    # Chat answers are read by the last-number rule.
    for g in groups[:2]:
        for s in g.samples:
            assert s.reward == float(scorer.task.reward(prompts[int(g.prompt_id[1:])], s.completion_text))


def test_stop_strings_end_a_completion_and_stay_in_it(parts) -> None:
    engine, scorer, settings = parts
    _, ids = prompts_and_ids(scorer)
    engine.settings = settings.model_copy(update={"stop": ["="]})
    try:
        out = engine.generate(ids[:2], engine.sampling_params(8, T, 48))
    finally:
        engine.settings = settings
    stopped = 0
    for group in out:
        for c in group:
            text = scorer.tokenizer.decode(c.token_ids)
            if "=" in text:  # it ended there: the stop string is in the last token, nowhere before
                assert c.finish_reason == "stop" and "=" not in scorer.tokenizer.decode(c.token_ids[:-1])
                stopped += 1
    assert stopped > 0, "SmolLM2 answers '37 + 45 = 82' often: some completions must have stopped at '='"


def test_a_trained_checkpoint_reloads_in_place_with_tied_weights(parts, smollm2: Path, tmp_path: Path) -> None:
    from safetensors import safe_open

    from tba.model.tokenizer import load_tokenizer

    engine, scorer, settings = parts
    prompts, ids = prompts_and_ids(scorer)
    groups = scorer.score(
        GeneratedBatch(
            prompts[:2],
            ids[:2],
            engine.generate(ids[:2], engine.sampling_params(4, T, 32)),
            version=engine.version,
            ref_is_policy=True,
        )
    )
    rows = [
        Row(
            ("arithmetic", g.prompt_id), tuple(g.prompt_ids), tuple(s.completion_ids), s.reward, s.ref_logprob_sum, 0, 0
        )
        for g in groups
        for s in g.samples
    ]
    # One TB step of the trainer's own learner on the real model (lr large enough to move the weights).
    model = hf_model(smollm2)
    optimizer, scheduler = build_optimizer(model, 1e-3, 0.0, LRSchedule())
    learner = Learner(
        model,
        optimizer,
        scheduler,
        make_loss("tb"),
        temperature=T,
        pad_id=scorer.pad_id,
        token_budget=16384,
        grad_clip=1.0,
    )
    result = learner.step(rows, beta=0.05)
    assert result.samples == len(rows) and torch.isfinite(torch.tensor(result.grad_norm))
    store = CheckpointStore(tmp_path / "ckpt")
    manifest = save_checkpoint(store, model, scorer.tokenizer, optimizer, scheduler, TrainerState(step=1, beta=0.05))
    directory = store.verify(manifest)
    with safe_open(str(directory / "model.safetensors"), "pt") as f:
        assert "lm_head.weight" not in f.keys()  # still tied on disk
    assert load_tokenizer(directory).chat_template == scorer.tokenizer.chat_template

    engine.reload(directory, manifest.version)
    new = hf_model(directory)
    assert new.lm_head.weight is new.model.embed_tokens.weight
    greedy_prompts = [scorer.prompt_format.encode(scorer.tokenizer, q) for q in QUESTIONS[:2]]
    vllm_greedy = [g[0].token_ids for g in engine.generate(greedy_prompts, engine.sampling_params(1, 0.0, 24))]
    with torch.inference_mode():
        for prompt_ids, got in zip(greedy_prompts, vllm_greedy, strict=True):
            x = torch.tensor([prompt_ids])
            hf = new.generate(
                x,
                attention_mask=torch.ones_like(x),
                max_new_tokens=24,
                do_sample=False,
                eos_token_id=EOS,
                pad_token_id=EOS,
            )[0, len(prompt_ids) :].tolist()
            assert got == hf[: len(got)] and len(got) == len(hf)  # token for token, EOS included
    # The behaviour log-probs now come from the new weights, not the base's.
    sampled = engine.generate(ids[:2], engine.sampling_params(4, T, 32))
    prompt_ids = [ids[p] for p, group in enumerate(sampled) for _ in group]
    completion_ids = [c.token_ids for group in sampled for c in group]
    with torch.no_grad():
        on_new = sequence_logprobs(new, prompt_ids, completion_ids, T, scorer.pad_id)
        on_base = sequence_logprobs(hf_model(smollm2), prompt_ids, completion_ids, T, scorer.pad_id)
    behaviour = torch.tensor([c.logprob_sum for group in sampled for c in group])
    # As exact as at the base weights: the tied output layer is rebuilt after the reload (worker_ext), without
    # which it kept the old embeddings' packed copy and these were off by up to a few nats after training.
    torch.testing.assert_close(behaviour, on_new, atol=2e-3, rtol=1e-4)
    assert (on_new - on_base).abs().max() > 0.2, "one step at lr 1e-3 should move the log-probs"


def test_multi_turn_log_probs_and_tb_loss_mask_the_environment_on_the_real_model(smollm2: Path) -> None:
    """SmolLM2-135M (grouped-query attention, tied embeddings, a chat template): a two-turn trajectory whose
    environment turn is a chat-templated tool message. The prefix trees' masked sums equal the sums written
    out token by token, and the learner's TB gradient equals the direct formula's on those sums."""
    from services.trainer.batching import plan_micro_batches
    from tba.model.logprobs import shared_prefix_logprobs
    from tba.model.tokenizer import PromptFormat, load_tokenizer
    from tba.schemas import scored_flags
    from tests.unit.test_logprobs import by_hand
    from tests.unit.test_losses import direct_tb

    tok = load_tokenizer(smollm2)
    prompt = PromptFormat(chat=True).encode(tok, "What is 37*45+8?")
    call = tok("[37*45]<|im_end|>\n", add_special_tokens=False)["input_ids"]
    result = tok("<|im_start|>user\n1665<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False)["input_ids"]
    answers = [tok(a + "<|im_end|>", add_special_tokens=False)["input_ids"] for a in ("1673", "1670", "It is 1673")]
    completions = [call + result + a for a in answers] + [answers[0]]  # three two-turn trajectories, one direct answer
    spans = [[[len(call), len(call) + len(result)]]] * 3 + [None]
    prompts = [prompt] * 4
    scored = scored_flags([len(c) for c in completions], spans)
    model = hf_model(smollm2)
    with torch.no_grad():
        expected = by_hand(model, prompts, completions, scored)
        trees = shared_prefix_logprobs(model, prompts, completions, T, EOS, scored)
        unmasked = shared_prefix_logprobs(model, prompts, completions, T, EOS)
    torch.testing.assert_close(trees, expected, atol=2e-3, rtol=1e-4)
    assert (unmasked[:3] - expected[:3]).abs().min() > 0.5  # the tool message's tokens are not in the sums

    rows = [
        Row(("calculator", "p"), tuple(prompt), tuple(c), r, -30.0 - i, 0, 0, s)
        for i, (c, r, s) in enumerate(zip(completions, [1.0, 0.0, 1.0, 1.0], spans, strict=True))
    ]
    optimizer, scheduler = build_optimizer(model, 1e-3, 0.0, LRSchedule())
    learner = Learner(
        model, optimizer, scheduler, make_loss("tb"), temperature=T, pad_id=EOS, token_budget=16384, grad_clip=None
    )
    model.zero_grad(set_to_none=True)
    learner.accumulate(plan_micro_batches(rows, 16384), beta=0.05, denom=len(rows))
    got = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
    model.zero_grad(set_to_none=True)
    log_pi = by_hand(model, prompts, completions, scored)
    _, dloss = direct_tb(log_pi.tolist(), [r.log_ref for r in rows], [r.reward for r in rows], ["p"] * 4, 0.05)
    (log_pi * torch.tensor(dloss)).sum().backward()
    want = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
    torch.testing.assert_close(got, want, rtol=1e-3, atol=1e-4 * want.abs().max().item())
