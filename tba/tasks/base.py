"""The task contract: a prompt source plus a reward function, registered by name.

A task hands out training prompts as an endless seeded stream (each searcher
replica seeds it differently, so replicas explore different prompts), a fixed
held-out evaluation set disjoint from training, and supervised examples for the
warm-up. Rewards are pure functions of the prompt and the completion text.

A task speaks one of two forms, fixed when it is made (:func:`make_task`): plain
(``37+45=``, completed by a model trained on the task's own format, the tiny model)
or chat (``What is 37+45? Answer with the number only.``, a user message for an
instruction-tuned model, rendered through its chat template by
:class:`~tba.model.tokenizer.PromptFormat`). The form sets the prompt text and how
the answer is read from a completion; a prompt's id is the same in both forms, so
the held-out split is too.
"""

from __future__ import annotations

import hashlib
import importlib
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar


@dataclass(frozen=True)
class Prompt:
    prompt_id: str
    text: str
    answer: str  # gold answer (exact for arithmetic, target for countdown, gold text for gsm8k)


class Task(ABC):
    name: ClassVar[str]
    multi_answer: ClassVar[bool] = False  # many distinct correct answers per prompt (diversity metrics)
    chat: bool = False  # prompts are user messages for a chat template; answers are read from chat replies

    @abstractmethod
    def train_prompts(self, seed: int) -> Iterator[Prompt]:
        """Endless stream of training prompts, never one of :meth:`eval_prompts`."""

    @abstractmethod
    def eval_prompts(self, n: int) -> list[Prompt]:
        """The first ``n`` prompts of the fixed held-out set (all of it, fewer than ``n``, when smaller)."""

    @abstractmethod
    def reward(self, prompt: Prompt, completion: str) -> float:
        """Task reward of ``completion`` (text without EOS) for ``prompt``."""

    def sft_target(self, prompt: Prompt) -> str:
        """A correct completion for the supervised warm-up."""
        raise NotImplementedError(f"task {self.name!r} has no supervised targets")

    def success(self, reward: float) -> bool:
        """Whether a reward counts as a correct answer (accuracy, pass@k); tasks with graded rewards override it."""
        return reward > 0

    def answer_key(self, prompt: Prompt, completion: str) -> str | None:
        """Canonical form of a correct answer (to count distinct ones); None if incorrect."""
        return completion.strip() if self.reward(prompt, completion) > 0 else None

    def rewards(self, prompt: Prompt, completions: list[str]) -> list[float]:
        """Batch form; tasks with a model-based reward override it."""
        return [self.reward(prompt, c) for c in completions]


@dataclass(frozen=True)
class Step:
    """The environment's answer to one model turn of an episode."""

    observation: str = ""  # text appended to the context before the model's next turn (a tool's result)
    done: bool = False
    reward: float | None = None  # the episode's reward once done; None: the task's reward() of the whole text


class MultiTurnTask(Task):
    """A task whose episodes alternate the model's turns with the environment's steps (tool calls, games).

    The searcher (and the held-out evaluation) run the episode (:mod:`tba.model.episodes`): the model
    generates a turn, which ends at EOS, at one of :attr:`turn_stop` or at the token budget; :meth:`step`
    answers it; its observation is tokenized into the context and the model goes on, until the environment
    says ``done``, :attr:`max_turns` model turns were taken or the episode's token budget is spent. The
    trajectory is trained on as one completion whose environment tokens are context, never scored (so
    :attr:`max_episode_tokens` with the prompt must fit the model's context). An
    exception from :meth:`start` or :meth:`step` ends that episode (dropped, counted with its reason), never
    the searcher. ``reward(prompt, text)`` reads the whole trajectory's text (the model's turns and the
    observations) when the environment gives no reward of its own."""

    max_turns: int = 4
    max_episode_tokens: int = 256  # the trajectory's tokens, the model's and the observations together
    turn_stop: tuple[str, ...] = ()  # strings that end a model turn besides EOS (a tool call's closing mark)
    concurrent_steps: int = 1  # episodes whose start/step may run at once (threads): a server's sessions

    def start(self, prompt: Prompt) -> Any:
        """A new episode's state for ``prompt`` (a game, a sandbox, a session); None by default."""
        return None

    @abstractmethod
    def step(self, prompt: Prompt, state: Any, turn: str) -> Step:
        """The environment's answer to the model's ``turn`` (its text, without EOS)."""

    def finish(self, state: Any) -> None:
        """Release an episode's state (always called once the episode ends, however it ends)."""


def is_held_out(key: str, fraction: float) -> bool:
    """Stable hash split: the same prompt is always on the same side, in every process."""
    h = int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big")
    return (h % 10_000) < fraction * 10_000


def check_fraction(fraction: float) -> float:
    if not 0.0 < fraction < 1.0:
        raise ValueError(f"held_out_fraction must be strictly between 0 and 1, got {fraction}")
    return fraction


def draw_distinct(draw: Callable[[], Prompt | None], n: int, max_draws: int) -> list[Prompt]:
    """The first ``n`` distinct prompts of a seeded stream (``draw`` returns None for a miss).

    Stops after ``max_draws`` draws, so a held-out set smaller than ``n`` gives
    all it has (fewer than ``n``) instead of an endless loop.
    """
    out: list[Prompt] = []
    seen: set[str] = set()
    for _ in range(max_draws):
        if len(out) >= n:
            break
        p = draw()
        if p is not None and p.prompt_id not in seen:
            seen.add(p.prompt_id)
            out.append(p)
    return out


_REGISTRY: dict[str, Callable[..., Task]] = {}
M = TypeVar("M", bound=Callable[..., Task])


def register(name: str) -> Callable[[M], M]:
    """Register a task class under ``name``; or a function that makes one of several classes by its options
    (each class then names itself)."""

    def wrap(make: M) -> M:
        if isinstance(make, type) and issubclass(make, Task):
            make.name = name
        _REGISTRY[name] = make
        return make

    return wrap


def task_names() -> list[str]:
    return sorted(_REGISTRY)


def task_class(name: str) -> Callable[..., Task]:
    """A registered task by name, or a task of the user's own named ``package.module:ClassName`` (a
    :class:`Task` subclass importable where the services run: installed, or on ``PYTHONPATH``)."""
    if name in _REGISTRY:
        return _REGISTRY[name]
    module, sep, attr = name.partition(":")
    if not sep:
        raise ValueError(f"unknown task {name!r}; known tasks: {', '.join(task_names())}, or package.module:Class")
    try:
        cls = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as err:
        raise ValueError(f"task {name!r}: cannot import {attr} from {module}: {err}") from None
    if not (isinstance(cls, type) and issubclass(cls, Task)):
        raise ValueError(f"task {name!r} is not a subclass of tba.tasks.Task")
    if not getattr(cls, "name", None):  # groups name their task: a class of your own is named as you named it
        cls.name = name
    return cls


def make_task(name: str, options: dict[str, Any] | None = None, *, chat: bool = False) -> Task:
    """Build a task (:func:`task_class`) in plain or chat form; unknown names and options get an error naming them."""
    cls = task_class(name)
    try:
        task = cls(**(options or {}))
    except TypeError as err:
        raise ValueError(f"bad options for task {name!r}: {err}") from None
    task.chat = chat
    return task
