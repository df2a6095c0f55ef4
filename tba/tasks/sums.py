"""Sums: write a number as the sum of two positive numbers, ``457=`` -> ``235+222``.

A multi-answer task the tiny model learns within minutes on two cores, for the diversity
experiment (experiments/diversity.py): a target n has n // 2 distinct correct answers (unordered
pairs), so the number of distinct correct answers among a policy's samples measures how much of
the answer space it keeps. A completion is correct when it reads ``a+b`` with positive whole
numbers a + b = n (leading zeros allowed, spaces ignored); :meth:`answer_key` is the unordered pair.

The supervised warm-up imitates *digit-wise* splits without carries, each drawn uniformly (457 ->
``235+222``: 2+2, 3+2, 5+2), written with as many digits as n: a correct answer the model can learn
digit by digit, of which n has hundreds. Reinforcement is free to find the others.

Chat form: ``Write 457 as the sum of two positive whole numbers. Answer in the form a+b (10+7 for
17).``; the answer is the last ``a+b`` in the reply.
"""

from __future__ import annotations

import random
import re
from collections.abc import Iterator

from tba.tasks.base import Prompt, Task, check_fraction, is_held_out, register

_PLAIN = re.compile(r"^\s*(\d+)\s*\+\s*(\d+)\s*$")
_ANYWHERE = re.compile(r"(\d+)\s*\+\s*(\d+)")


@register("sums")
class Sums(Task):
    multi_answer = True

    def __init__(self, low: int = 100, high: int = 999, held_out_fraction: float = 0.1, seed: int = 0) -> None:
        if not 2 <= low <= high <= 10**6:
            raise ValueError(f"need 2 <= low <= high <= 1000000, got low={low}, high={high}")
        self.low, self.high = low, high
        self.held_out_fraction = check_fraction(held_out_fraction)
        self._targets = random.Random(f"sums-sft-{seed}")  # the warm-up's draws of a split

    def _prompt(self, n: int) -> Prompt:
        text = (
            f"Write {n} as the sum of two positive whole numbers. Answer in the form a+b (10+7 for 17)."
            if self.chat
            else f"{n}="
        )
        return Prompt(prompt_id=f"sum:{n}", text=text, answer=str(n))

    def _held_out(self, n: int) -> bool:
        return is_held_out(f"sum:{n}", self.held_out_fraction)

    def train_prompts(self, seed: int) -> Iterator[Prompt]:
        rng = random.Random(f"sums-train-{seed}")
        while True:
            n = rng.randint(self.low, self.high)
            if not self._held_out(n):
                yield self._prompt(n)

    def eval_prompts(self, n: int) -> list[Prompt]:
        held = [self._prompt(k) for k in range(self.low, self.high + 1) if self._held_out(k)]
        random.Random("sums-eval").shuffle(held)
        return held[:n]

    def parse(self, completion: str) -> tuple[int, int] | None:
        """The (a, b) a completion answers, or None when it is not of the form a+b."""
        if self.chat:
            found = _ANYWHERE.findall(completion)
            return (int(found[-1][0]), int(found[-1][1])) if found else None
        m = _PLAIN.match(completion)
        return (int(m.group(1)), int(m.group(2))) if m else None

    def answer_key(self, prompt: Prompt, completion: str) -> str | None:
        pair = self.parse(completion)
        if pair is None or min(pair) < 1 or sum(pair) != int(prompt.answer):
            return None
        return "{}+{}".format(*sorted(pair))

    def reward(self, prompt: Prompt, completion: str) -> float:
        return 0.0 if self.answer_key(prompt, completion) is None else 1.0

    def sft_target(self, prompt: Prompt) -> str:
        """A digit-wise split of n without carries, both parts positive, each written with n's digits."""
        digits = [int(d) for d in prompt.answer]
        if sum(digits) < 2:  # 100, 1000: no digit-wise split has two positive sides
            n, width = int(prompt.answer), len(prompt.answer)
            return f"{1:0{width}d}+{n - 1:0{width}d}"
        while True:
            a = [self._targets.randint(0, d) for d in digits]
            b = [d - x for d, x in zip(digits, a, strict=True)]
            if any(a) and any(b):
                return "".join(map(str, a)) + "+" + "".join(map(str, b))
