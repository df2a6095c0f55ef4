"""Countdown: reach a target from given numbers with + - * and parentheses.

The CPU stand-in for the diversity-seeking tasks (red-teaming): a prompt has
many distinct correct answers (``24 from 2 3 4 6:`` -> ``4*6``, ``2*3*4``,
``3*(2+6)``, ``(6-3)*2*4``, ...), so the number of distinct correct answers
among n samples measures diversity (:meth:`answer_key` canonicalises them).
Completions are checked by the safe parser of :mod:`tba.tasks.expr`, never
``eval``: each given number may be used at most once, not every number must be
used. Prompts are generated so that solutions exist (the target is drawn from
the values at least ``min_solutions`` distinct expressions reach), and kept
short for the tiny model (``24 from 2 3 4 6:`` and answers of at most ~12 characters).

Chat form: the same puzzle asked in words; the answer is the last run of
expression characters in the reply that holds an operator (``4*6 = 24`` gives
``4*6``). The prompt id is the plain text in both forms.
"""

from __future__ import annotations

import random
import re
from collections import Counter
from collections.abc import Iterator

from tba.tasks import expr
from tba.tasks.base import Prompt, Task, check_fraction, draw_distinct, is_held_out, register

_PROMPT = re.compile(r"^(\d+) from (\d+(?: \d+)*):$")
_EXPRESSION_RUN = re.compile(r"[0-9+\-*() ]+")


def parse_prompt(text: str) -> tuple[int, list[int]]:
    """(target, given numbers) of a countdown prompt text."""
    m = _PROMPT.match(text)
    if m is None:
        raise ValueError(f"not a countdown prompt: {text!r}")
    return int(m.group(1)), [int(x) for x in m.group(2).split()]


@register("countdown")
class Countdown(Task):
    multi_answer = True

    def __init__(
        self,
        count: int = 4,
        max_number: int = 9,
        min_target: int = 10,
        max_target: int = 50,
        min_solutions: int = 3,
        held_out_fraction: float = 0.1,
    ) -> None:
        if not 2 <= count <= 5:
            raise ValueError(f"count must be between 2 and 5 (the brute-force search grows fast), got {count}")
        if not 1 <= max_number <= 99:
            raise ValueError(f"max_number must be between 1 and 99, got {max_number}")
        if not 0 <= min_target <= max_target <= 9999:
            raise ValueError(f"need 0 <= min_target <= max_target <= 9999, got {min_target}, {max_target}")
        self.count = count
        self.max_number = max_number
        self.min_target = min_target
        self.max_target = max_target
        if min_solutions < 1:
            raise ValueError(f"min_solutions must be >= 1, got {min_solutions}")
        self.min_solutions = min_solutions
        self._solved: dict[tuple[int, ...], dict[int, dict[str, str]]] = {}
        self.held_out_fraction = check_fraction(held_out_fraction)
        self._probe()

    def _probe(self) -> None:
        """Fail at construction, not in an endless loop, when the options admit no prompt."""
        rng = random.Random("countdown-probe")
        for _ in range(200):
            if self._targets(self._numbers(rng)):
                return
        raise ValueError(
            f"no prompt with {self.min_solutions}+ solutions for count={self.count}, "
            f"max_number={self.max_number}, targets {self.min_target}..{self.max_target}: widen the range"
        )

    def _numbers(self, rng: random.Random) -> tuple[int, ...]:
        return tuple(sorted(rng.randint(1, self.max_number) for _ in range(self.count)))

    def _solve(self, given: tuple[int, ...]) -> dict[int, dict[str, str]]:
        """Eligible targets of a number set -> their distinct answers (cached: ~500 sets by default)."""
        if given not in self._solved:
            if len(self._solved) > 20_000:
                self._solved.clear()
            found = expr.solve_all(given, self.min_target, self.max_target)
            self._solved[given] = {
                v: keys for v, keys in sorted(found.items()) if len(keys) >= self.min_solutions and v not in given
            }
        return self._solved[given]

    def _targets(self, given: tuple[int, ...]) -> list[int]:
        """Targets with at least ``min_solutions`` distinct answers, none of them a given number."""
        return list(self._solve(given))

    def _split_key(self, given: tuple[int, ...]) -> str:
        # Split on the number set, not the prompt: a held-out set of numbers never
        # appears in training with any target.
        return " ".join(map(str, given))

    def _try(self, rng: random.Random, held_out: bool) -> Prompt | None:
        """One draw: a prompt on the asked side of the split, or None."""
        given = self._numbers(rng)
        if is_held_out(self._split_key(given), self.held_out_fraction) != held_out:
            return None
        targets = self._targets(given)
        if not targets:
            return None
        target, numbers = rng.choice(targets), " ".join(map(str, given))
        plain = f"{target} from {numbers}:"
        text = (
            (
                f"Use some of the numbers {numbers}, each at most once, with +, -, * and parentheses to make "
                f"{target}. Answer with the expression only."
            )
            if self.chat
            else plain
        )
        return Prompt(prompt_id=plain, text=text, answer=str(target))

    def train_prompts(self, seed: int) -> Iterator[Prompt]:
        rng = random.Random(f"countdown-train-{self.count}-{self.max_number}-{seed}")
        misses = 0
        while True:
            p = self._try(rng, held_out=False)
            if p is not None:
                misses = 0
                yield p
            elif (misses := misses + 1) > 100_000:
                raise ValueError("countdown: no training prompt in 100000 draws; widen the options")

    def eval_prompts(self, n: int) -> list[Prompt]:
        rng = random.Random(f"countdown-eval-{self.count}-{self.max_number}-{self.min_target}-{self.max_target}")
        return draw_distinct(
            lambda: self._try(rng, held_out=True), n, max_draws=1000 + int(100 * n / self.held_out_fraction)
        )

    def _expression(self, completion: str) -> str:
        """The answer's text: the completion (plain), or its last run of expression characters with an operator."""
        if not self.chat:
            return completion.strip()
        runs = [r.strip() for r in _EXPRESSION_RUN.findall(completion) if any(op in r for op in "+-*")]
        return runs[-1] if runs else ""

    def _check(self, prompt: Prompt, completion: str) -> expr.Node | None:
        """The parsed completion if it is a correct answer, else None."""
        target, given = parse_prompt(prompt.prompt_id)
        try:
            node = expr.parse(self._expression(completion))
        except expr.ExpressionError:
            return None
        if expr.numbers(node) - Counter(given):  # a number not given, or used too often
            return None
        return node if expr.value(node) == target else None

    def reward(self, prompt: Prompt, completion: str) -> float:
        return 1.0 if self._check(prompt, completion) is not None else 0.0

    def answer_key(self, prompt: Prompt, completion: str) -> str | None:
        node = self._check(prompt, completion)
        return None if node is None else expr.canonical(node)

    def sft_target(self, prompt: Prompt) -> str:
        target, given = parse_prompt(prompt.prompt_id)
        found = self._solve(tuple(sorted(given))).get(target) or expr.solutions(given, target)
        if not found:
            raise ValueError(f"prompt {prompt.text!r} has no solution")
        return min(found.values(), key=lambda t: (len(t), t))
