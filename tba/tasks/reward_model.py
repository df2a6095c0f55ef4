"""Rewards from a local Hugging Face sequence-classification model (the TL;DR setup).

Prompts come from a local JSONL file (``{"prompt": ...}``, optionally a
reference ``"completion"`` used as the supervised target); the reward of a
completion is the model's score (one logit) of ``prompt + completion``. The
model is loaded on the first reward call, not at construction, so processes
that only need prompts (the trainer) never load it; a bad directory still fails
at construction. Scoring is batched (:meth:`RewardModelTask.rewards`) and does
not depend on the batch: the classifier reads the last non-padding token.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tba.tasks.base import Prompt, Task, register
from tba.tasks.files import PromptFile, Row, text_id


@register("reward-model")
class RewardModelTask(Task):
    def __init__(
        self,
        model_dir: str | None = None,
        path: str | None = None,
        eval_path: str | None = None,
        held_out_fraction: float = 0.1,
        batch_size: int = 32,
        max_length: int = 256,
        label: int = 0,
        device: str = "cpu",
    ) -> None:
        if model_dir is None or path is None:
            raise ValueError(
                "reward-model needs the options model_dir (HF sequence-classification "
                'model directory) and path (JSONL file of {"prompt": ...} lines)'
            )
        if not (Path(model_dir) / "config.json").is_file():
            raise ValueError(f"reward-model: {model_dir} is not a Hugging Face model directory (no config.json)")
        if batch_size < 1 or max_length < 2:
            raise ValueError(
                f"reward-model: batch_size must be >= 1 and max_length >= 2, got {batch_size}, {max_length}"
            )
        self.model_dir = Path(model_dir)
        self.batch_size = batch_size
        self.max_length = max_length
        self.label = label
        self.device = device
        self._targets: dict[str, str] = {}
        self._scorer: Any = None
        self.data = PromptFile(
            "reward-model",
            Path(path),
            self._to_prompt,
            ("prompt",),
            eval_path=eval_path,
            held_out_fraction=held_out_fraction,
        )

    def _to_prompt(self, row: Row) -> Prompt:
        pid = text_id(row["prompt"])
        if isinstance(row.get("completion"), str):
            self._targets[pid] = row["completion"]
        return Prompt(prompt_id=pid, text=row["prompt"], answer="")

    def train_prompts(self, seed: int) -> Iterator[Prompt]:
        return self.data.train_prompts(seed)

    def eval_prompts(self, n: int) -> list[Prompt]:
        return self.data.eval_prompts(n)

    def _load(self) -> Any:
        import torch
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(str(self.model_dir))
        model = AutoModelForSequenceClassification.from_pretrained(str(self.model_dir), dtype=torch.float32)
        if model.config.pad_token_id is None and tokenizer.pad_token_id is not None:
            model.config.pad_token_id = tokenizer.pad_token_id
        if not 0 <= self.label < model.config.num_labels:
            raise ValueError(f"reward-model: label {self.label} but the model has {model.config.num_labels} outputs")
        self._scorer = (model.to(self.device).eval(), tokenizer)
        return self._scorer

    def _score(self, texts: list[str]) -> list[float]:
        import torch

        model, tokenizer = self._scorer or self._load()
        # Without a padding token a batch cannot be padded: score one text at a time.
        step = self.batch_size if model.config.pad_token_id is not None else 1
        out: list[float] = []
        with torch.no_grad():
            for start in range(0, len(texts), step):
                enc = tokenizer(
                    texts[start : start + step],
                    return_tensors="pt",
                    padding=True,
                    truncation=True,
                    max_length=self.max_length,
                ).to(self.device)
                logits = model(**enc).logits  # (B, num_labels)
                out.extend(float(v) for v in logits[:, self.label].float().cpu())
        return out

    def reward(self, prompt: Prompt, completion: str) -> float:
        return self._score([prompt.text + completion])[0]

    def rewards(self, prompt: Prompt, completions: list[str]) -> list[float]:
        return self._score([prompt.text + c for c in completions]) if completions else []

    def sft_target(self, prompt: Prompt) -> str:
        if prompt.prompt_id not in self._targets:
            raise NotImplementedError('reward-model: this prompt\'s line has no "completion" to imitate')
        return self._targets[prompt.prompt_id]
