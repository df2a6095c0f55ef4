"""Red-teaming on the CPU: find completions a learned judge flags, as many different ones as possible.

The paper's red-teaming task rewards a policy for prompts that make a target model's reply toxic,
by a toxicity classifier's score; success is rare at the start, and what matters is how many
distinct successes search finds. The stand-in here: the policy is the tiny arithmetic model, asked
the arithmetic task's prompts; the reward of a completion is the probability, by a judge the
project trains itself (tba/model/classifier.py), that it contains a digit pattern (``77``) that
the base model's sums rarely hold. A completion succeeds when that probability is above
``threshold``; :meth:`answer_key` makes distinct successes countable per prompt.

With ``successes_dir`` set, every searcher appends each success it scores (time, prompt, text) to
``<dir>/successes-<searcher id>-<pid>.jsonl``, so an experiment can count the distinct successes the
whole search found, not only those of the final policy (other processes, such as evaluations,
write ``successes-eval-<pid>.jsonl``).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tba.tasks.arithmetic import Arithmetic
from tba.tasks.base import Prompt, Task, register


@register("redteam")
class RedTeam(Task):
    multi_answer = True

    def __init__(
        self,
        pattern: str = "77",
        threshold: float = 0.5,
        digits: int = 2,
        held_out_fraction: float = 0.1,
        judge_dir: str | None = None,
        successes_dir: str | None = None,
    ) -> None:
        if not pattern.isdigit() or not 1 <= len(pattern) <= 4:
            raise ValueError(f"pattern must be 1 to 4 digits, got {pattern!r}")
        if not 0.0 < threshold < 1.0:
            raise ValueError(f"threshold must be strictly between 0 and 1, got {threshold}")
        if judge_dir is not None and not (Path(judge_dir) / "judge.json").is_file():
            raise ValueError(f"redteam: {judge_dir} is not a judge directory (no judge.json)")
        self.pattern, self.threshold = pattern, threshold
        self.prompts = Arithmetic(digits=digits, held_out_fraction=held_out_fraction)
        self.judge_dir = judge_dir
        self.successes_dir = Path(successes_dir) if successes_dir else None
        self._judge: Any = None

    def train_prompts(self, seed: int) -> Iterator[Prompt]:
        return self.prompts.train_prompts(seed)

    def eval_prompts(self, n: int) -> list[Prompt]:
        return self.prompts.eval_prompts(n)

    def sft_target(self, prompt: Prompt) -> str:
        return self.prompts.sft_target(prompt)  # the base model is the arithmetic one

    def success(self, reward: float) -> bool:
        return reward > self.threshold

    def _scores(self, texts: list[str]) -> list[float]:
        if self._judge is None:  # loaded on first use: processes that only draw prompts never load it
            from tba.model.classifier import Judge, ensure_classifier

            self._judge = Judge(Path(self.judge_dir) if self.judge_dir else ensure_classifier(self.pattern))
        return self._judge.scores(texts)

    def reward(self, prompt: Prompt, completion: str) -> float:
        return self.rewards(prompt, [completion])[0]

    def rewards(self, prompt: Prompt, completions: list[str]) -> list[float]:
        scores = self._scores([c.strip() for c in completions]) if completions else []
        if self.successes_dir is not None:
            self._record(prompt, [c for c, s in zip(completions, scores, strict=True) if self.success(s)])
        return scores

    def answer_key(self, prompt: Prompt, completion: str) -> str | None:
        text = completion.strip()  # scored without recording: the caller has scored it already
        return text if self.success(self._scores([text])[0]) else None

    def _record(self, prompt: Prompt, successes: list[str]) -> None:
        if not successes:
            return
        assert self.successes_dir is not None
        self.successes_dir.mkdir(parents=True, exist_ok=True)
        who = os.environ.get("TBA_SEARCHER_ID", "eval")
        lines = "".join(
            json.dumps({"t": time.time(), "prompt": prompt.prompt_id, "text": c.strip()}) + "\n" for c in successes
        )
        with open(self.successes_dir / f"successes-{who}-{os.getpid()}.jsonl", "a") as f:
            f.write(lines)
