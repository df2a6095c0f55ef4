"""Procedurally generated addition, exactly verifiable: ``37+45=`` -> ``82``.

The CPU stand-in for GSM8K. ``digits`` sets the operand size; a fixed hash
split keeps held-out prompts out of training. Plain form: the completion must
be the sum exactly. Chat form: ``What is 37+45? Answer with the number only.``,
and the last number of the reply is the answer (instruction-tuned models say
``37 + 45 = 82``).
"""

from __future__ import annotations

import random
from collections.abc import Iterator

from tba.tasks.answers import last_number
from tba.tasks.base import Prompt, Task, check_fraction, draw_distinct, is_held_out, register

# Below this many operand pairs the held-out set is enumerated: exact, and it
# ends when the set is exhausted (1-digit addition holds only ~10 held-out prompts).
_ENUMERATE_LIMIT = 100_000


@register("arithmetic")
class Arithmetic(Task):
    def __init__(self, digits: int = 2, held_out_fraction: float = 0.1) -> None:
        if not 1 <= digits <= 6:
            raise ValueError(f"digits must be between 1 and 6, got {digits}")
        self.digits = digits
        self.held_out_fraction = check_fraction(held_out_fraction)
        self.low = 0 if digits == 1 else 10 ** (digits - 1)
        self.high = 10**digits - 1

    def _prompt(self, a: int, b: int) -> Prompt:
        text = f"What is {a}+{b}? Answer with the number only." if self.chat else f"{a}+{b}="
        return Prompt(prompt_id=f"{a}+{b}=", text=text, answer=str(a + b))

    def _draw(self, rng: random.Random) -> Prompt:
        return self._prompt(rng.randint(self.low, self.high), rng.randint(self.low, self.high))

    def train_prompts(self, seed: int) -> Iterator[Prompt]:
        rng = random.Random(f"arithmetic-train-{self.digits}-{seed}")
        while True:
            p = self._draw(rng)
            if not is_held_out(p.prompt_id, self.held_out_fraction):
                yield p

    def eval_prompts(self, n: int) -> list[Prompt]:
        rng = random.Random(f"arithmetic-eval-{self.digits}")
        span = range(self.low, self.high + 1)
        if len(span) ** 2 <= _ENUMERATE_LIMIT:
            held = [self._prompt(a, b) for a in span for b in span]
            held = [p for p in held if is_held_out(p.prompt_id, self.held_out_fraction)]
            rng.shuffle(held)
            return held[:n]

        def draw() -> Prompt | None:
            p = self._draw(rng)
            return p if is_held_out(p.prompt_id, self.held_out_fraction) else None

        return draw_distinct(draw, n, max_draws=1000 + int(100 * n / self.held_out_fraction))

    def reward(self, prompt: Prompt, completion: str) -> float:
        if self.chat:
            return 1.0 if last_number(completion) == int(prompt.answer) else 0.0
        return 1.0 if completion.strip() == prompt.answer else 0.0

    def sft_target(self, prompt: Prompt) -> str:
        return prompt.answer
