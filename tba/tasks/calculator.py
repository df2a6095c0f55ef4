"""A tool-use task the tiny model learns on the CPU: a product too hard to work out in its head, a calculator
to call, and a small sum to finish with.

Prompt ``37*45+8=``. The model calls the calculator by writing an expression in brackets, ``[37*45]``
(the ``]`` ends its turn); the environment answers with the value and a semicolon, ``1665;``, and the
model goes on. A turn without a call is the answer: the episode ends, reward 1 when it is the number
exactly. The whole trajectory, ``[37*45]`` ``1665;`` ``1673<eos>``, is trained on as one completion whose
``1665;`` is the environment's (context, never scored). Expressions are parsed by :mod:`tba.tasks.expr`,
never evaluated as code; one it refuses gets ``error;``. Chat form: the same episode after a user
message that explains the calculator, the answer read as the last number of the final turn.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

from tba.tasks.answers import last_number
from tba.tasks.base import MultiTurnTask, Prompt, Step, check_fraction, draw_distinct, is_held_out, register
from tba.tasks.expr import ExpressionError, parse, value

CALL_OPEN, CALL_CLOSE, RESULT_END = "[", "]", ";"


def tool_call(turn: str) -> str | None:
    """The expression a turn asks the calculator for (``...[37*45]`` -> ``37*45``), None for an answer."""
    text = turn.rstrip()
    if not text.endswith(CALL_CLOSE) or CALL_OPEN not in text:
        return None
    return text[text.rindex(CALL_OPEN) + 1 : -1]


def calculate(expression: str) -> str:
    """What the calculator answers: the value and :data:`RESULT_END`, or ``error;``."""
    try:
        return f"{value(parse(expression))}{RESULT_END}"
    except ExpressionError:
        return f"error{RESULT_END}"


@register("calculator")
class Calculator(MultiTurnTask):
    max_turns = 3
    max_episode_tokens = 48
    turn_stop = (CALL_CLOSE,)

    def __init__(self, digits: int = 2, addend_digits: int = 1, held_out_fraction: float = 0.1) -> None:
        if not 1 <= digits <= 4:
            raise ValueError(f"digits must be between 1 and 4, got {digits}")
        if not 1 <= addend_digits <= 4:
            raise ValueError(f"addend_digits must be between 1 and 4, got {addend_digits}")
        self.digits, self.addend_digits = digits, addend_digits
        self.held_out_fraction = check_fraction(held_out_fraction)

    def _prompt(self, a: int, b: int, c: int) -> Prompt:
        if self.chat:
            text = (
                f"What is {a}*{b}+{c}? You can use a calculator: write an expression in brackets, like [12*34], "
                "and it answers with the value. Answer with the number only."
            )
        else:
            text = f"{a}*{b}+{c}="
        return Prompt(prompt_id=f"{a}*{b}+{c}=", text=text, answer=str(a * b + c))

    def _draw(self, rng: random.Random) -> Prompt:
        low, high = 10 ** (self.digits - 1), 10**self.digits - 1
        return self._prompt(rng.randint(low, high), rng.randint(low, high), rng.randint(1, 10**self.addend_digits - 1))

    def train_prompts(self, seed: int) -> Iterator[Prompt]:
        rng = random.Random(f"calculator-train-{self.digits}-{self.addend_digits}-{seed}")
        while True:
            p = self._draw(rng)
            if not is_held_out(p.prompt_id, self.held_out_fraction):
                yield p

    def eval_prompts(self, n: int) -> list[Prompt]:
        rng = random.Random(f"calculator-eval-{self.digits}-{self.addend_digits}")

        def draw() -> Prompt | None:
            p = self._draw(rng)
            return p if is_held_out(p.prompt_id, self.held_out_fraction) else None

        return draw_distinct(draw, n, max_draws=1000 + int(100 * n / self.held_out_fraction))

    def step(self, prompt: Prompt, state: Any, turn: str) -> Step:
        expression = tool_call(turn)
        if expression is not None:
            return Step(observation=calculate(expression))
        return Step(done=True, reward=self._grade(prompt, turn))

    def reward(self, prompt: Prompt, completion: str) -> float:
        """The whole trajectory's text: its answer is what follows the last calculator result."""
        return self._grade(prompt, completion.rsplit(RESULT_END, 1)[-1])

    def _grade(self, prompt: Prompt, answer: str) -> float:
        if self.chat:
            return 1.0 if last_number(answer) == int(prompt.answer) else 0.0
        return 1.0 if answer.strip() == prompt.answer else 0.0

    def sft_target(self, prompt: Prompt) -> str:
        product = prompt.prompt_id.split("+")[0]
        return f"{CALL_OPEN}{product}{CALL_CLOSE}{calculate(product)}{prompt.answer}"
