"""LoRA runs (peft) on the tiny model: the trainer's side, checkpoints, merge, and the searcher serving adapters.

Real parts throughout: peft on transformers for the trainer, adapter checkpoints written and read back
with the real loaders, and the real vLLM CPU engine loading them as LoRA adapters in place.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
import torch

from services.trainer.batching import Row
from services.trainer.checkpointing import TrainerState, find_resume_point, save_checkpoint
from services.trainer.learner import Learner
from services.trainer.losses import make_loss
from services.trainer.optim import LRSchedule, build_optimizer
from tba.checkpoints import CheckpointStore
from tba.model.adapters import (
    ADAPTER_CONFIG,
    ADAPTER_WEIGHTS,
    AdapterError,
    is_adapter,
    load_for_inference,
    vllm_max_rank,
    wrap_for_training,
)
from tba.model.logprobs import sequence_logprobs, shared_prefix_logprobs
from tba.model.tokenizer import encode_prompt, load_tokenizer
from tba.settings import DEFAULT_TARGETS

pytestmark = pytest.mark.slow

T = 0.7
RANK = 8
PROMPTS = ["12+34=", "5+7=", "99+1=", "40+40="]


def base_model(path: Path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32)


def lora_model(tiny_model: Path, seed: int = 0):
    """The tiny model with rank-8 adapters that matter: peft starts B at zero (adapters that change nothing)."""
    torch.manual_seed(seed)
    model = wrap_for_training(base_model(tiny_model), tiny_model, RANK, 16.0, 0.0, DEFAULT_TARGETS)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0.0, 0.05)
    return model


def sequences(tokenizer, n: int = 3, length: int = 6, seed: int = 0) -> tuple[list[list[int]], list[list[int]]]:
    """``n`` random completions per prompt, some sharing prefixes (the trainer's prefix trees then share them)."""
    g = torch.Generator().manual_seed(seed)
    prompts, completions = [], []
    for text in PROMPTS:
        ids = encode_prompt(tokenizer, text)
        first = torch.randint(3, tokenizer.vocab_size, (length,), generator=g).tolist()
        for i in range(n):
            tail = torch.randint(3, tokenizer.vocab_size, (length - 2,), generator=g).tolist()
            prompts.append(ids)
            completions.append(first[:2] + tail if i else first)
    return prompts, completions


def publish(store: CheckpointStore, model, tokenizer, step: int):
    optimizer, scheduler = build_optimizer(model, 1e-3, 0.0, LRSchedule())
    return save_checkpoint(store, model, tokenizer, optimizer, scheduler, TrainerState(step=step, beta=0.05))


def test_adapter_logprobs_equal_the_merged_models(tiny_model: Path, tmp_path: Path) -> None:
    tok = load_tokenizer(tiny_model)
    model = lora_model(tiny_model).eval()
    prompts, completions = sequences(tok)
    store = CheckpointStore(tmp_path / "ckpt")
    directory = store.verify(publish(store, model, tok, step=1))
    merged = load_for_inference(directory)
    with torch.no_grad():
        on_adapters = sequence_logprobs(model, prompts, completions, T, tok.pad_token_id)
        on_merged = sequence_logprobs(merged, prompts, completions, T, tok.pad_token_id)
        trees = shared_prefix_logprobs(model, prompts, completions, T, tok.pad_token_id)
        on_base = sequence_logprobs(base_model(tiny_model), prompts, completions, T, tok.pad_token_id)
    torch.testing.assert_close(on_adapters, on_merged, atol=1e-4, rtol=1e-5)
    torch.testing.assert_close(trees, on_merged, atol=1e-4, rtol=1e-5)  # the trainer's prefix-tree path too
    assert (on_adapters - on_base).abs().max() > 0.1, "the adapters must change the policy for this to mean much"


def test_a_lora_step_trains_the_adapters_only(tiny_model: Path) -> None:
    tok = load_tokenizer(tiny_model)
    model = lora_model(tiny_model)
    optimizer, scheduler = build_optimizer(model, 1e-2, 0.0, LRSchedule())
    in_optimizer = [p for group in optimizer.param_groups for p in group["params"]]
    adapters = {n: p for n, p in model.named_parameters() if "lora_" in n}
    assert {id(p) for p in in_optimizer} == {id(p) for p in adapters.values()}
    assert sum(p.numel() for p in in_optimizer) < 0.1 * sum(p.numel() for p in model.parameters())
    frozen = {n: p.detach().clone() for n, p in model.named_parameters() if "lora_" not in n}
    before = {n: p.detach().clone() for n, p in adapters.items()}
    prompts, completions = sequences(tok)
    rows = [
        Row(("arithmetic", str(tuple(p))), tuple(p), tuple(c), float(i % 2), -20.0, 0, 0)
        for i, (p, c) in enumerate(zip(prompts, completions, strict=True))
    ]
    learner = Learner(
        model,
        optimizer,
        scheduler,
        make_loss("tb"),
        temperature=T,
        pad_id=tok.pad_token_id,
        token_budget=4096,
        grad_clip=1.0,
    )
    result = learner.step(rows, beta=0.05)
    assert result.samples == len(rows) and 0 < result.grad_norm < float("inf")
    for n, p in model.named_parameters():
        if n in frozen:
            assert torch.equal(p, frozen[n]), f"{n} is the base model's and must not move"
    assert any(not torch.equal(p, before[n]) for n, p in adapters.items())
    assert not any(p.grad is not None for n, p in model.named_parameters() if n in frozen)


def test_the_trainers_reference_pass_is_the_policy_with_its_adapters_off(tiny_model: Path) -> None:
    """TBA_REF_PASS=trainer in a LoRA run: log pi_ref is the base model's, computed on the policy itself with
    the adapters disabled (no second copy), and the policy comes back with its adapters on and in train mode."""
    from services.trainer.batching import plan_micro_batches
    from services.trainer.reference import TrainerReference

    tok = load_tokenizer(tiny_model)
    model = lora_model(tiny_model)
    reference = TrainerReference(model, str(tiny_model), lora=True, device=torch.device("cpu"))
    assert reference.frozen is None
    prompts, completions = sequences(tok)
    rows = [
        Row(("arithmetic", str(tuple(p))), tuple(p), tuple(c), float(i % 2), None, 0, 0)
        for i, (p, c) in enumerate(zip(prompts, completions, strict=True))
    ]
    optimizer, scheduler = build_optimizer(model, 1e-2, 0.0, LRSchedule())
    learner = Learner(
        model, optimizer, scheduler, make_loss("tb"), temperature=T, pad_id=tok.pad_token_id, token_budget=4096,
        grad_clip=1.0, reference=reference,
    )  # fmt: skip
    (mb,) = plan_micro_batches(rows, 4096)
    with torch.no_grad():
        on_base = sequence_logprobs(base_model(tiny_model), mb.prompts, mb.completions, T, tok.pad_token_id)
        on_policy = sequence_logprobs(model, mb.prompts, mb.completions, T, tok.pad_token_id)
    assert (on_policy - on_base).abs().max() > 0.1, "the adapters must change the policy for this to mean much"
    model.train()
    torch.testing.assert_close(learner.log_ref(mb), on_base, atol=1e-4, rtol=1e-5)
    assert model.training
    # ... and equal to what a searcher of the same run computes (TBA_REF_PASS=searcher): its own base model.
    from services.searcher.reference import Reference
    from tba.settings import SearcherSettings

    searcher = Reference(SearcherSettings(model=str(tiny_model), lora_rank=RANK, temperature=T), tok.pad_token_id)
    by_searcher = torch.tensor(searcher.logprobs(mb.prompts, mb.completions))
    torch.testing.assert_close(learner.log_ref(mb), by_searcher, atol=1e-4, rtol=1e-5)
    with torch.no_grad():  # the adapters are on again
        torch.testing.assert_close(sequence_logprobs(model, mb.prompts, mb.completions, T, tok.pad_token_id), on_policy)
    before = {n: p.detach().clone() for n, p in model.named_parameters() if "lora_" in n}
    result = learner.step(rows, beta=0.05)
    assert result.ref_seconds > 0 and 0 < result.grad_norm < float("inf")
    assert any(not torch.equal(p, before[n]) for n, p in model.named_parameters() if "lora_" in n)


def test_a_lora_checkpoint_is_the_adapter_only_and_resumes(tiny_model: Path, tmp_path: Path) -> None:
    from services.trainer.loop import Trainer
    from tba.settings import SettingsError, TrainerSettings

    tok = load_tokenizer(tiny_model)
    model = lora_model(tiny_model, seed=1)
    store = CheckpointStore(tmp_path / "ckpt")
    directory = store.verify(publish(store, model, tok, step=2))
    names = {p.name for p in directory.iterdir() if p.is_file()}
    assert {ADAPTER_CONFIG, ADAPTER_WEIGHTS} <= names and "model.safetensors" not in names, names
    assert is_adapter(directory)
    full = sum(p.numel() * 4 for p in base_model(tiny_model).parameters())
    assert (directory / ADAPTER_WEIGHTS).stat().st_size < 0.2 * full

    settings = TrainerSettings(
        model=tiny_model, checkpoint_dir=store.root, lora_rank=RANK, buffer_url="http://127.0.0.1:9"
    )
    resumed = Trainer(settings).load_model(find_resume_point(store).directory)
    saved = dict(model.named_parameters())
    for name, p in resumed.named_parameters():
        torch.testing.assert_close(p, saved[name], atol=0, rtol=0)
        assert p.requires_grad == ("lora_" in name), name
    with pytest.raises(SettingsError, match="rank 8 .* the settings ask for rank 16"):
        Trainer(settings.model_copy(update={"lora_rank": 16})).load_model(directory)
    with pytest.raises(SettingsError, match="TBA_LORA_RANK=0, but the checkpoint to resume .* is an adapter"):
        Trainer(settings.model_copy(update={"lora_rank": 0})).load_model(directory)
    with pytest.raises(SettingsError, match="is a full model"):
        Trainer(settings).load_model(tiny_model)


def test_tba_model_merge_writes_a_full_model_that_loads_as_is(tiny_model: Path, tmp_path: Path, capsys) -> None:
    from tba.model.cli import main

    tok = load_tokenizer(tiny_model)
    model = lora_model(tiny_model, seed=2).eval()
    store = CheckpointStore(tmp_path / "ckpt")
    directory = store.verify(publish(store, model, tok, step=1))

    def merge(out: Path, base: Path | None = None) -> int:
        return main(argparse.Namespace(model_command="merge", adapter=directory, out=out, base=base))

    assert merge(tmp_path / "merged") == 0
    merged = base_model(tmp_path / "merged")
    prompts, completions = sequences(tok)
    with torch.no_grad():
        torch.testing.assert_close(
            sequence_logprobs(merged, prompts, completions, T, tok.pad_token_id),
            sequence_logprobs(model, prompts, completions, T, tok.pad_token_id),
            atol=1e-4,
            rtol=1e-5,
        )
    assert load_tokenizer(tmp_path / "merged").get_vocab() == tok.get_vocab()
    assert merge(tmp_path / "merged") == 2
    assert "exists and is not empty" in capsys.readouterr().err
    assert merge(tmp_path / "other", base=tmp_path / "nothing") == 2
    assert "is not a model directory here; name the base model (--base)" in capsys.readouterr().err
    assert not (tmp_path / "other").exists()


@pytest.mark.parametrize(
    ("text", "needle"),
    [("[1, 2]", "peft_type None"), ('{"peft_type": "IA3"}', "'IA3'"), ("{not json", "not a readable adapter config")],
)
def test_an_adapter_config_that_is_not_lora_is_refused_with_the_reason(tmp_path: Path, text: str, needle: str) -> None:
    from tba.model.adapters import read_adapter_config

    (tmp_path / ADAPTER_CONFIG).write_text(text)
    with pytest.raises(AdapterError, match=needle):
        read_adapter_config(tmp_path)


def test_vllm_adapter_slots() -> None:
    assert [vllm_max_rank(r) for r in (1, 2, 8, 9, 64, 300, 512)] == [1, 8, 8, 16, 64, 320, 512]
    with pytest.raises(AdapterError, match="above vLLM's largest"):
        vllm_max_rank(513)


# --- the searcher: adapters served by the real vLLM engine ---------------------------------------------------


@pytest.mark.vllm
def test_the_searcher_serves_each_published_adapter_in_place(tiny_model: Path, tmp_path: Path, redis_server) -> None:
    """Greedy generations equal transformers + peft on the same adapter; the next adapter replaces it; a bad one is
    refused with the engine still serving the last; a batch is stamped with the adapter's version and scored
    against the base model (the reference)."""
    from services.searcher.engine import Engine, ReloadError
    from services.searcher.loop import Searcher
    from services.searcher.scorer import Scorer
    from tba.checkpoints import announce
    from tba.codec import decode
    from tba.keys import STREAM_FIELD, Keys
    from tba.schemas import ScoredGroup
    from tba.settings import SearcherSettings
    from tba.tasks import make_task

    tok = load_tokenizer(tiny_model)
    store = CheckpointStore(tmp_path / "ckpt")
    settings = SearcherSettings(
        model=tiny_model,
        redis_url=redis_server.url,
        namespace="t",
        checkpoint_dir=store.root,
        spill_dir=tmp_path / "spill",
        searcher_id="s-lora",
        completions_per_prompt=4,
        prompts_per_batch=4,
        max_new_tokens=12,
        temperature=T,
        max_model_len=64,
        kv_cache_gib=1,
        lora_rank=RANK,
        max_batches=1,
        reload_poll_seconds=0.2,
        generation_dtype="float32",  # greedy tokens and log-probs compared with the float32 adapters'
    )
    adapters = [lora_model(tiny_model, seed=s).eval() for s in (3, 4)]
    manifests = [publish(store, m, tok, step=v) for v, m in ((1, adapters[0]), (2, adapters[1]))]
    ids = [encode_prompt(tok, t) for t in PROMPTS]

    def hf_greedy(model) -> list[list[int]]:
        out = []
        with torch.inference_mode():
            for prompt in ids:
                x = torch.tensor([prompt])
                gen = model.generate(
                    x,
                    attention_mask=torch.ones_like(x),
                    max_new_tokens=12,
                    do_sample=False,
                    eos_token_id=tok.eos_token_id,
                    pad_token_id=tok.pad_token_id,
                )
                out.append(gen[0, len(prompt) :].tolist())
        return out

    engine = Engine(settings, tiny_model, version=0, seed=0)
    try:
        greedy = engine.sampling_params(1, 0.0, 12)
        at_base = [g[0].token_ids for g in engine.generate(ids, greedy)]
        for manifest, model in zip(manifests, adapters, strict=True):
            pause = engine.reload(store.verify(manifest), manifest.version)
            assert engine.version == manifest.version and pause < 30
            assert set(engine.llm.llm_engine.list_loras()) == {manifest.version}, "the previous adapter is removed"
            assert [g[0].token_ids for g in engine.generate(ids, greedy)] == hf_greedy(model)
        assert hf_greedy(adapters[1]) != at_base, "the adapters must change what the model generates"

        bad = store.new_tmp_dir()  # rank 64 does not fit the engine's rank-8 slots
        torch.manual_seed(5)
        wrap_for_training(base_model(tiny_model), tiny_model, 64, 16.0, 0.0, DEFAULT_TARGETS).save_pretrained(bad)
        with pytest.raises(ReloadError, match="could not load adapter"):
            engine.reload(bad, 3)
        assert engine.version == 2 and set(engine.llm.llm_engine.list_loras()) == {2}
        assert [g[0].token_ids for g in engine.generate(ids, greedy)] == hf_greedy(adapters[1])

        # A searcher that starts on the base and learns of version 2: its batch comes from the adapter.
        engine.reload(store.verify(manifests[0]), 1)
        announce(redis_server.client(), Keys("t"), manifests[1])
        scorer = Scorer(settings, make_task("arithmetic"), settings.searcher_id)
        searcher = Searcher(settings, engine, scorer)
        try:
            assert searcher.run() == 0
        finally:
            searcher.close()
    finally:
        engine.close()
    entries = redis_server.client().xrange(Keys("t").trajectories)
    groups = [decode(f[STREAM_FIELD.encode()], ScoredGroup, vocab_size=tok.vocab_size) for _id, f in entries]
    assert groups and all(g.policy_version == 2 for g in groups)
    prompt_ids = [g.prompt_ids for g in groups for _ in g.samples]
    completion_ids = [s.completion_ids for g in groups for s in g.samples]
    with torch.no_grad():
        on_adapter = sequence_logprobs(adapters[1], prompt_ids, completion_ids, T, tok.pad_token_id)
        on_base = sequence_logprobs(base_model(tiny_model), prompt_ids, completion_ids, T, tok.pad_token_id)
    behaviour = torch.tensor([s.logprob_sum for g in groups for s in g.samples])
    reference = torch.tensor([s.ref_logprob_sum for g in groups for s in g.samples])
    torch.testing.assert_close(behaviour, on_adapter, atol=2e-3, rtol=1e-4)
    torch.testing.assert_close(reference, on_base, atol=2e-3, rtol=1e-4)
