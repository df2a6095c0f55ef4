"""The tiny model the project makes: loads in transformers and in the real vLLM CPU engine, and both
decode it token for token alike (one engine for the module; the SFT weights are hot-reloaded into it)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import torch

from tba.local.commands import tba_command
from tba.model.evaluation import load_model
from tba.model.generate import generate
from tba.model.logprobs import sequence_logprobs
from tba.model.threads import torch_threads
from tba.model.tokenizer import CHARACTERS, SPECIAL_TOKENS, encode_prompt
from tba.tasks import make_task

MAX_NEW = 12
T = 0.7


def prompt_texts() -> list[str]:
    return [p.text for p in make_task("arithmetic").eval_prompts(24)] + [
        p.text for p in make_task("countdown").eval_prompts(8)
    ]


def test_loads_with_auto_classes(tiny_model: Path) -> None:
    from transformers import AutoConfig, AutoTokenizer

    config = AutoConfig.from_pretrained(str(tiny_model))
    assert config.model_type == "llama" and config.head_dim == 64
    assert config.hidden_size // config.num_attention_heads == 64
    tok = AutoTokenizer.from_pretrained(str(tiny_model))
    assert len(tok) == config.vocab_size == len(SPECIAL_TOKENS) + len(set(CHARACTERS))
    ids = encode_prompt(tok, "37+45=")
    assert ids[0] == tok.bos_token_id and len(ids) == 7
    assert tok.decode(ids, skip_special_tokens=True) == "37+45="
    text = "Question: Tom's 3 cats ate 1,250 g (50%)?\nAnswer: #### 42"
    assert tok.decode(tok(text, add_special_tokens=False)["input_ids"]) == text  # one token per character
    model, _ = load_model(tiny_model)
    assert next(model.parameters()).dtype == torch.float32


def test_cli_init_writes_a_loadable_model(tmp_path: Path) -> None:
    out = tmp_path / "m"
    proc = subprocess.run(
        tba_command("model", "init", out=out, hidden_size=128, layers=2, seed=3),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    model, tok = load_model(out)
    assert model.config.hidden_size == 128 and model.config.num_hidden_layers == 2
    assert model.config.num_attention_heads == 2 and tok.eos_token_id == model.config.eos_token_id


def test_batched_greedy_decoding_does_not_depend_on_the_batch(tiny_model: Path) -> None:
    model, tok = load_model(tiny_model)
    prompts = [encode_prompt(tok, t) for t in prompt_texts()]
    with torch_threads():
        batched = generate(model, prompts, max_new_tokens=MAX_NEW, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id)
        alone = [
            generate(model, [p], max_new_tokens=MAX_NEW, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id)[0]
            for p in prompts[:6]
        ]
    assert batched[:6] == alone
    assert all(0 < len(c) <= MAX_NEW for c in batched)


@pytest.fixture(scope="module")
def llm(tiny_model: Path):
    from vllm import LLM

    # On the CPU backend gpu_memory_utilization is the fraction of RAM vLLM insists is free at start
    # (default 0.92): keep it low, other processes share this machine.
    engine = LLM(
        model=str(tiny_model),
        dtype="float32",
        max_model_len=128,
        enforce_eager=True,
        seed=0,
        logprobs_mode="processed_logprobs",
        gpu_memory_utilization=0.2,
    )
    yield engine
    core = getattr(getattr(engine, "llm_engine", None), "engine_core", None)
    if core is not None and hasattr(core, "shutdown"):
        core.shutdown()


def vllm_generate(llm, tok, texts: list[str], **params) -> list:
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    sp = SamplingParams(max_tokens=MAX_NEW, stop_token_ids=[tok.eos_token_id], **params)
    outs = llm.generate([TokensPrompt(prompt_token_ids=encode_prompt(tok, t)) for t in texts], sp, use_tqdm=False)
    return [o.outputs[0] for o in outs]


def assert_same_greedy(llm, model_dir: Path) -> list[list[int]]:
    model, tok = load_model(model_dir)
    texts = prompt_texts()
    with torch_threads():
        ours = generate(
            model,
            [encode_prompt(tok, t) for t in texts],
            max_new_tokens=MAX_NEW,
            eos_id=tok.eos_token_id,
            pad_id=tok.pad_token_id,
        )
    theirs = [list(o.token_ids) for o in vllm_generate(llm, tok, texts, temperature=0.0)]
    for text, a, b in zip(texts, ours, theirs, strict=True):
        assert a == b, f"{text!r}: transformers {a} != vLLM {b}"
    return ours


@pytest.mark.slow
@pytest.mark.vllm
def test_vllm_and_transformers_greedy_are_identical(llm, tiny_model: Path) -> None:
    assert_same_greedy(llm, tiny_model)


@pytest.mark.slow
@pytest.mark.vllm
def test_vllm_sampled_logprobs_match_the_shared_definition(llm, tiny_model: Path) -> None:
    model, tok = load_model(tiny_model)
    texts = prompt_texts()[:8]
    outs = vllm_generate(llm, tok, texts, temperature=T, logprobs=0, seed=1)
    prompts = [encode_prompt(tok, t) for t in texts]
    expected = sequence_logprobs(model, prompts, [list(o.token_ids) for o in outs], T, tok.pad_token_id)
    got = torch.tensor([o.cumulative_logprob for o in outs])
    assert torch.allclose(got, expected.double().float(), atol=1e-4), (got, expected)


@pytest.mark.slow
@pytest.mark.vllm
def test_sft_model_reloaded_into_vllm_decodes_identically(llm, sft_model: Path) -> None:
    llm.collective_rpc("reload_weights", kwargs={"weights_path": str(sft_model)})
    completions = assert_same_greedy(llm, sft_model)
    _, tok = load_model(sft_model)
    task = make_task("arithmetic")
    texts = prompt_texts()[:24]
    answers = [tok.decode(c, skip_special_tokens=True) for c in completions[:24]]
    # trained weights, not the random ones: every completion is a well-formed number with EOS
    assert all(c[-1] == tok.eos_token_id for c in completions[:24])
    assert all(a.isdigit() for a in answers)
    assert sum(task.reward(p, a) for p, a in zip(task.eval_prompts(24), answers, strict=True)) > 0
    assert [p.text for p in task.eval_prompts(24)] == texts
