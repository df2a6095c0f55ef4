"""Prompt datasets read from local JSONL files (GSM8K-style data, reward-model prompts).

No dataset hub is reachable, so real tasks read local files. A dataset is a
training file plus either an evaluation file or a stable hash split of the
training file; a prompt that appears in the evaluation set is never served for
training. Bad files fail at construction with the file and line named.
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from tba.tasks.base import Prompt, check_fraction, is_held_out

Row = dict[str, Any]


def read_jsonl(path: str | Path, required: tuple[str, ...]) -> list[Row]:
    """Rows of a JSONL file (blank lines skipped); ValueError naming the file and line on a bad one."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"dataset file {path} does not exist")
    rows: list[Row] = []
    with path.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except ValueError as err:
                raise ValueError(f"{path}:{lineno}: not valid JSON ({err})") from None
            if not isinstance(row, dict):
                raise ValueError(f"{path}:{lineno}: expected a JSON object, got {type(row).__name__}")
            for key in required:
                if not isinstance(row.get(key), str) or not row[key].strip():
                    raise ValueError(f"{path}:{lineno}: field {key!r} is missing or not a non-empty string")
            rows.append(row)
    return rows


def text_id(text: str) -> str:
    """Stable prompt id of a text prompt: short, the same in every process."""
    return hashlib.sha256(text.encode()).hexdigest()[:16]


class PromptFile:
    """Training and held-out prompts of a JSONL dataset.

    ``to_prompt`` turns a row into a :class:`Prompt`; prompts with the same id
    are kept once. With ``eval_path`` the held-out set is that file; without
    it, a ``held_out_fraction`` hash split of ``path``.
    """

    def __init__(
        self,
        name: str,
        path: str | Path,
        to_prompt: Callable[[Row], Prompt],
        required: tuple[str, ...],
        eval_path: str | Path | None = None,
        held_out_fraction: float = 0.1,
    ) -> None:
        self.name = name
        train = _unique(to_prompt(r) for r in read_jsonl(path, required))
        if eval_path is not None:
            held = _unique(to_prompt(r) for r in read_jsonl(eval_path, required))
            held_ids = {p.prompt_id for p in held}
            self.train = [p for p in train if p.prompt_id not in held_ids]
        else:
            check_fraction(held_out_fraction)
            held = [p for p in train if is_held_out(p.prompt_id, held_out_fraction)]
            self.train = [p for p in train if not is_held_out(p.prompt_id, held_out_fraction)]
        self.held_out = held
        if not self.train:
            raise ValueError(f"{name}: no training prompts left in {path} after removing held-out ones")

    def train_prompts(self, seed: int) -> Iterator[Prompt]:
        """Endless: a fresh seeded shuffle of the training prompts every epoch."""
        epoch = 0
        while True:
            order = list(self.train)
            random.Random(f"{self.name}-train-{seed}-{epoch}").shuffle(order)
            yield from order
            epoch += 1

    def eval_prompts(self, n: int) -> list[Prompt]:
        return self.held_out[:n]


def _unique(prompts: Iterator[Prompt]) -> list[Prompt]:
    seen: set[str] = set()
    out = []
    for p in prompts:
        if p.prompt_id not in seen:
            seen.add(p.prompt_id)
            out.append(p)
    return out
