"""reasoning-gym's procedural generators as tasks (PyPI ``reasoning-gym``): any of its datasets by name, its
own scorer as the reward.

``TBA_TASK=reasoning-gym`` with ``TBA_TASK_OPTIONS='{"dataset": "chain_sum", "config": {"max_terms": 3}}'``:
``config`` goes to ``reasoning_gym.create_dataset`` as the generator's options (an unknown one is an error
naming it; an option the generator takes as an enum, such as aiw's ``task_types``, is named by its value:
``{"task_types": ["siblings", "friends"]}``). Training prompts are an endless seeded stream of the generator's
entries; the held-out set is the first entries of a fixed seed, and a stable hash of the question keeps every
held-out question out of training, as for the built-in tasks.

The reward is the dataset's ``score_answer`` on the answer read from the completion: in chat form the
question is a user message asking for the answer in ``<answer>`` tags, read by reasoning-gym's own
``extract_answer``; in plain form (a model trained on the task's format) the prompt is the question and
``Answer:``, and the completion is the answer. A prompt counts as solved at a score of 1 (some generators
give partial credit).

``reader``: ``tags`` (the above) or ``lenient``, for a small instruction-tuned model that answers in a
sentence ("The sum is 7.") more often than in the tags it was asked for: the tags' content where there
are tags, else the last number of the completion where the generator's answers are numbers
(:func:`tba.tasks.answers.last_number`, the GSM8K rule), else its last non-empty line.

The scorer needs the entry a question came from; the task keeps the entries it handed out (the newest
:data:`REMEMBERED`), so the searcher that drew a prompt, and an evaluation that drew the held-out set, can
score it.
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import itertools
import threading
from collections import OrderedDict
from collections.abc import Iterator
from decimal import Decimal
from typing import Any

from tba.tasks.answers import last_number
from tba.tasks.base import Prompt, Task, check_fraction, is_held_out, register

INSTALL = "pip install reasoning-gym==0.1.25 (or pip install -e '.[envs]')"
REMEMBERED = 200_000  # entries kept for scoring: far more than the prompts in flight at any time
CHUNK = 1_000  # entries generated per seed of the stream
EVAL_SEED = 1_000_003  # the held-out set's seed: no training chunk uses it
CHAT_INSTRUCTION = "Give only the final answer, inside <answer></answer> tags."
READERS = ("tags", "lenient")


def _library() -> Any:
    try:
        import reasoning_gym
    except ImportError:
        raise ValueError(f"task 'reasoning-gym' needs the reasoning-gym package: {INSTALL}") from None
    return reasoning_gym


def _enum_options(config_class: type, config: dict[str, Any]) -> dict[str, Any]:
    """``config`` with each value given for an enum-valued option of the generator (its default an enum, or a
    list of them) turned into that enum, so that JSON can name it; a value the enum lacks is an error naming
    the values it has."""
    out = dict(config)
    for f in dataclasses.fields(config_class):
        if f.name not in config:
            continue
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        sample = default[0] if isinstance(default, list) and default else default
        if not isinstance(sample, enum.Enum):
            continue
        kind, value = type(sample), config[f.name]
        try:
            out[f.name] = [kind(v) for v in value] if isinstance(value, list) else kind(value)
        except ValueError:
            raise ValueError(
                f"reasoning-gym option {f.name!r} takes {', '.join(repr(m.value) for m in kind)}, got {value!r}"
            ) from None
    return out


@register("reasoning-gym")
class ReasoningGym(Task):
    def __init__(
        self,
        dataset: str = "chain_sum",
        config: dict[str, Any] | None = None,
        held_out_fraction: float = 0.1,
        reader: str = "tags",
    ) -> None:
        if reader not in READERS:
            raise ValueError(f"reasoning-gym reader must be one of {', '.join(READERS)}, got {reader!r}")
        self.reader = reader
        rg = _library()
        if dataset not in rg.factory.DATASETS:
            raise ValueError(
                f"reasoning-gym has no dataset {dataset!r}; it has {len(rg.factory.DATASETS)}, e.g. "
                f"{', '.join(sorted(rg.factory.DATASETS)[:12])}, ..."
            )
        self.dataset = dataset
        self.config = _enum_options(rg.factory.DATASETS[dataset][1], config or {})
        self.held_out_fraction = check_fraction(held_out_fraction)
        self._generate(seed=0, size=1)  # a bad option fails here, when the task is made, naming the option
        # Drawn by the searcher's generating thread, read by its scoring thread.
        self._entries: OrderedDict[str, tuple[Any, dict[str, Any]]] = OrderedDict()
        self._lock = threading.Lock()

    def _generate(self, seed: int, size: int) -> Any:
        try:
            return _library().create_dataset(self.dataset, seed=seed, size=size, **self.config)
        except (TypeError, ValueError, AssertionError) as err:
            raise ValueError(f"reasoning-gym dataset {self.dataset!r} refused config {self.config}: {err}") from None

    def _prompts(self, seed: int) -> Iterator[tuple[Prompt, bool]]:
        """The entries of the stream of ``seed``, chunk after chunk, each with whether it is held out."""
        for chunk in itertools.count():
            data = self._generate(seed=seed * 100_003 + chunk, size=CHUNK)
            for entry in data:
                question = str(entry["question"])
                digest = hashlib.sha256(question.encode()).hexdigest()[:20]
                prompt = Prompt(f"{self.dataset}/{digest}", self._text(question), str(entry["answer"]))
                with self._lock:
                    self._entries[prompt.prompt_id] = (data, entry)
                    self._entries.move_to_end(prompt.prompt_id)
                    while len(self._entries) > REMEMBERED:
                        self._entries.popitem(last=False)
                yield prompt, is_held_out(question, self.held_out_fraction)

    def _text(self, question: str) -> str:
        question = question.strip()
        return f"{question}\n{CHAT_INSTRUCTION}" if self.chat else f"{question}\nAnswer: "

    def train_prompts(self, seed: int) -> Iterator[Prompt]:
        return (p for p, held in self._prompts(seed + 1) if not held)

    def eval_prompts(self, n: int) -> list[Prompt]:
        out: dict[str, Prompt] = {}
        for drawn, (prompt, held) in enumerate(self._prompts(EVAL_SEED)):
            if len(out) >= n or drawn >= 1000 + int(100 * n / self.held_out_fraction):
                break
            if held:
                out.setdefault(prompt.prompt_id, prompt)
        return list(out.values())

    def reward(self, prompt: Prompt, completion: str) -> float:
        with self._lock:
            found = self._entries.get(prompt.prompt_id)
        if found is None:
            raise KeyError(f"reasoning-gym prompt {prompt.prompt_id!r} was not drawn by this task object")
        data, entry = found
        answer = self.read_answer(completion, str(entry["answer"]))
        if not answer:
            return 0.0
        return float(data.score_answer(answer=answer, entry=entry))

    def read_answer(self, completion: str, expected: str) -> str | None:
        """The answer a completion gives, by the task's ``reader`` (``expected``: the entry's own answer, which
        says whether answers are numbers)."""
        from reasoning_gym.utils import extract_answer

        tagged = extract_answer(completion, tag_name="answer") if self.chat or self.reader == "lenient" else None
        if self.reader == "tags":
            return tagged if self.chat else completion.strip()
        if tagged:
            return tagged.strip()
        if last_number(expected) is not None:
            number = last_number(completion)
            return None if number is None else _plain(number)
        lines = [line.strip() for line in completion.splitlines() if line.strip()]
        return lines[-1] if lines else None

    def success(self, reward: float) -> bool:
        return reward >= 1.0

    def sft_target(self, prompt: Prompt) -> str:
        return f"<answer>{prompt.answer}</answer>" if self.chat else prompt.answer


def _plain(number: Decimal) -> str:
    """A number as the generators write their answers: ``7``, not ``7.0`` or ``7E+1``."""
    return format(number.normalize(), "f") if number != number.to_integral() else str(int(number))
