"""GSM8K-format math word problems from a local JSONL file, scored as in the paper.

Each line is ``{"question": ..., "answer": "... #### 42"}``. The reward is 1
when the last number in the completion equals the last number of the gold
answer (the part after ``####`` when present), commas stripped and compared as
numbers (``1,000`` = ``1000.0``), else 0 (the paper's rule), in both forms. The
plain form prompts with ``template``; the chat form asks the question itself.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path

from tba.tasks.answers import last_number
from tba.tasks.base import Prompt, Task, register
from tba.tasks.files import PromptFile, Row, text_id

DEFAULT_TEMPLATE = "Question: {question}\nAnswer:"


def gold_number(answer: str) -> Decimal | None:
    """The gold answer's number: the last number after ``####``, else the last number at all."""
    _, sep, final = answer.rpartition("####")
    return last_number(final if sep else answer)


@register("gsm8k")
class GSM8K(Task):
    def __init__(
        self,
        path: str | None = None,
        eval_path: str | None = None,
        held_out_fraction: float = 0.1,
        template: str = DEFAULT_TEMPLATE,
    ) -> None:
        if path is None:
            raise ValueError("gsm8k needs the option path (a local JSONL file of question/answer lines)")
        if "{question}" not in template:
            raise ValueError("gsm8k option template must contain {question}")
        self.template = template
        self.data = PromptFile(
            "gsm8k",
            Path(path),
            self._to_prompt,
            ("question", "answer"),
            eval_path=eval_path,
            held_out_fraction=held_out_fraction,
        )

    def _to_prompt(self, row: Row) -> Prompt:
        """The question as the prompt text; :meth:`_form` puts it into the template of the plain form."""
        question = row["question"].strip()
        if gold_number(row["answer"]) is None:
            raise ValueError(f"gsm8k answer has no number: {row['answer'][:80]!r}")
        return Prompt(prompt_id=text_id(question), text=question, answer=row["answer"])

    def _form(self, prompt: Prompt) -> Prompt:
        return prompt if self.chat else dataclasses.replace(prompt, text=self.template.format(question=prompt.text))

    def train_prompts(self, seed: int) -> Iterator[Prompt]:
        return map(self._form, self.data.train_prompts(seed))

    def eval_prompts(self, n: int) -> list[Prompt]:
        return [self._form(p) for p in self.data.eval_prompts(n)]

    def reward(self, prompt: Prompt, completion: str) -> float:
        got = last_number(completion)
        return 1.0 if got is not None and got == gold_number(prompt.answer) else 0.0

    def sft_target(self, prompt: Prompt) -> str:
        return " " + prompt.answer.strip()
