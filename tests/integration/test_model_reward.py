"""The reward-model task with a real (tiny, randomly initialised) Hugging Face sequence classifier
that the test makes and saves itself, loaded back through the task's own code path."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tba.model.evaluation import evaluate_checkpoint
from tba.model.tokenizer import build_tokenizer
from tba.tasks import make_task

COMPLETIONS = [" short", " a much longer summary of it", " 12+7", "", " x"]


@pytest.fixture(scope="module")
def reward_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from transformers import LlamaConfig, LlamaForSequenceClassification

    tok = build_tokenizer()
    config = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=1,
        num_attention_heads=1,
        num_key_value_heads=1,
        head_dim=64,
        num_labels=1,
        pad_token_id=tok.pad_token_id,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
    )
    torch.manual_seed(0)
    model = LlamaForSequenceClassification(config)
    with torch.no_grad():
        model.score.weight.normal_(0, 1.0)  # scores far enough apart to tell completions apart
    out = tmp_path_factory.mktemp("rm") / "reward-model"
    model.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def prompts_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("rm-data") / "prompts.jsonl"
    rows = [{"prompt": f"Post {i}: my cat ate {i} socks today. TL;DR:"} for i in range(40)]
    rows[0]["completion"] = " cat ate socks"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture
def task(reward_model_dir: Path, prompts_file: Path):
    return make_task(
        "reward-model",
        {"model_dir": str(reward_model_dir), "path": str(prompts_file), "held_out_fraction": 0.25, "batch_size": 3},
    )


def direct_score(model_dir: Path, text: str) -> float:
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(model_dir))
    model = AutoModelForSequenceClassification.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    with torch.no_grad():
        return float(model(**tok([text], return_tensors="pt")).logits[0, 0])


def test_batched_scores_equal_single_scores_and_the_model_output(task, reward_model_dir: Path) -> None:
    prompt = task.eval_prompts(1)[0]
    batched = task.rewards(prompt, COMPLETIONS)  # batch_size 3: two padded batches
    single = [task.reward(prompt, c) for c in COMPLETIONS]
    assert batched == pytest.approx(single, abs=1e-5)
    assert len(set(round(r, 4) for r in batched)) == len(COMPLETIONS)  # it does read the completion
    assert batched[1] == pytest.approx(direct_score(reward_model_dir, prompt.text + COMPLETIONS[1]), abs=1e-5)
    assert task.rewards(prompt, []) == []


def test_prompts_split_and_targets(task) -> None:
    held = task.eval_prompts(100)
    train = [p for _, p in zip(range(200), task.train_prompts(0), strict=False)]
    assert 3 <= len(held) <= 20
    assert not {p.prompt_id for p in held} & {p.prompt_id for p in train}
    assert len({p.prompt_id for p in train}) == 40 - len(held)
    with_target = [p for p in held + train if p.text.startswith("Post 0:")][0]
    assert task.sft_target(with_target) == " cat ate socks"
    other = next(p for p in train if not p.text.startswith("Post 0:"))
    with pytest.raises(NotImplementedError, match='no "completion"'):
        task.sft_target(other)


def test_eval_runs_with_the_reward_model(task, tiny_model: Path) -> None:
    result = evaluate_checkpoint(tiny_model, task, 4, samples=2, pass_k=(1, 2), max_new_tokens=6, threads=1)
    assert result["task"] == "reward-model" and result["n_prompts"] == 4
    assert isinstance(result["greedy_reward"], float) and isinstance(result["sampled_reward"], float)
    assert result["distinct_correct"] is None
