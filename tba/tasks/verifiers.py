"""verifiers environments (PyPI ``verifiers``, its ``verifiers.v1`` stack) as tasks: an installed taskset
loaded by name, its rows as prompts, its rewards as the reward.

``TBA_TASK=verifiers`` with ``TBA_TASK_OPTIONS='{"env": "my-env", "args": {...}}'``: ``env`` is the
taskset's id as verifiers resolves it (a built-in, or any importable module ``my_env`` that exports one
``Taskset`` subclass), ``args`` its config fields. The rows are loaded once; a stable hash of a row's prompt
puts it in the held-out set or in training (training prompts are the training rows, shuffled by the seed,
round after round), unless ``eval_args`` names a config of its own for the held-out rows (``{"split":
"eval"}``), whose rows are then all held out.

A row's prompt is its text, or its chat messages: in chat form the system prompt (the row's) and the user
messages become the user turn the model's chat template renders; in plain form, the user text alone. The
reward is the taskset's: each completion goes into a verifiers ``Trace`` (the row's messages, then the
completion as the assistant's sampled reply) and the task's ``score`` runs its ``@reward`` functions
(and judges) on it, without a runtime; ``trace.reward`` is the weighted sum. A prompt counts as solved at a
positive reward.

A taskset whose environment runs its own loop (it exports an ``Env`` subclass, or ``env_id`` pairs it with
one, verifiers' ``--env.id``) is a multi-turn task instead: ``TBA_TASK=verifiers`` makes a
:class:`~tba.tasks.verifiers_env.VerifiersEnv`, which runs that ``Env``'s ``run`` in the searcher with the
model's turns as the trained seat's (tba/tasks/verifiers_env.py).
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Iterator
from typing import Any

from tba.tasks.base import Prompt, Task, check_fraction, is_held_out

INSTALL = "pip install verifiers==0.4.0 (or pip install -e '.[envs]')"


def library() -> Any:
    try:
        import verifiers.v1 as vf
    except ImportError:
        raise ValueError(f"task 'verifiers' needs the verifiers package: {INSTALL}") from None
    return vf


def runs_own_loop(vf: Any, env: str, env_id: str) -> bool:
    """Whether the taskset's environment (its own ``Env``, or the one ``env_id`` pairs it with) is other than
    the plain single-agent one."""
    try:
        return vf.environment_class(env, env_id) is not vf.SingleAgentEnv
    except (ImportError, AttributeError, TypeError, ValueError) as err:
        raise ValueError(f"verifiers environment {env_id or env!r} could not be loaded: {err}") from None


class Verifiers(Task):
    """A single-turn taskset (``TBA_TASK=verifiers`` makes one whose ``Env`` runs its own loop a
    :class:`~tba.tasks.verifiers_env.VerifiersEnv` instead: :func:`~tba.tasks.verifiers_env.verifiers_task`)."""

    name = "verifiers"

    def __init__(
        self,
        env: str,
        args: dict[str, Any] | None = None,
        eval_args: dict[str, Any] | None = None,
        held_out_fraction: float = 0.1,
    ) -> None:
        vf = library()
        self.vf, self.env_id = vf, env
        self.held_out_fraction = check_fraction(held_out_fraction)
        try:
            rows = self._load(args)
            held = self._load(eval_args) if eval_args is not None else None
        except (ImportError, AttributeError, TypeError) as err:
            raise ValueError(f"verifiers environment {env!r} could not be loaded: {err}") from None
        if held is None:
            held = [r for r in rows if is_held_out(self._user_text(r[1].data), self.held_out_fraction)]
            rows = [r for r in rows if not is_held_out(self._user_text(r[1].data), self.held_out_fraction)]
        if not rows or not held:
            raise ValueError(f"verifiers environment {env!r}: {len(rows)} training and {len(held)} held-out rows")
        self._train, self._held = rows, held
        self._tasks = dict([*rows, *held])

    def _load(self, args: dict[str, Any] | None) -> list[tuple[str, Any]]:
        """The taskset's rows under ``args``: (prompt id, its verifiers task)."""
        vf = self.vf
        config_type = vf.taskset_config_type(self.env_id)
        try:
            config = config_type(id=self.env_id, **(args or {}))
        except Exception as err:  # noqa: BLE001 (pydantic's error names the field)
            raise ValueError(f"verifiers environment {self.env_id!r} refused args {args}: {err}") from None
        return [(f"{self.env_id}/{t.data.name or t.data.id or t.data.idx}", t) for t in vf.load_taskset(config)]

    def _prompt(self, prompt_id: str, task: Any) -> Prompt:
        """A row as a prompt in the task's form, made when drawn: the form (``chat``) is set after the task is."""
        return Prompt(prompt_id, self._text(task.data), str(getattr(task.data, "answer", "")))

    @staticmethod
    def _user_text(data: Any) -> str:
        if isinstance(data.prompt, str):
            return data.prompt
        return "\n\n".join(str(m.content) for m in data.prompt or [] if getattr(m, "role", "") == "user")

    def _text(self, data: Any) -> str:
        """The row's prompt as one user turn: the user text; in chat form after the row's system prompt."""
        if self.chat and data.system_prompt:
            return f"{data.system_prompt}\n\n{self._user_text(data)}"
        return self._user_text(data)

    def train_prompts(self, seed: int) -> Iterator[Prompt]:
        rng = random.Random(f"verifiers-{self.env_id}-{seed}")
        while True:
            order = list(self._train)
            rng.shuffle(order)
            yield from (self._prompt(*row) for row in order)

    def eval_prompts(self, n: int) -> list[Prompt]:
        return [self._prompt(*row) for row in self._held[:n]]

    def reward(self, prompt: Prompt, completion: str) -> float:
        return self.rewards(prompt, [completion])[0]

    def rewards(self, prompt: Prompt, completions: list[str]) -> list[float]:
        task = self._tasks[prompt.prompt_id]

        async def score_all() -> list[float]:
            traces = [self._trace(task, c) for c in completions]
            await asyncio.gather(*(task.score(t) for t in traces))
            return [float(t.reward) for t in traces]

        return asyncio.run(score_all())

    def _trace(self, task: Any, completion: str) -> Any:
        """A verifiers trace of the row answered by ``completion``: what its rewards read."""
        vf = self.vf
        data = task.data
        trace = vf.Trace(
            task=vf.TraceTask(type=type(task).__name__, data=data, key=task.key, hash=task.hash),
            agent=vf.AgentInfo(config=vf.AgentConfig(runtime=vf.SubprocessConfig())),
        )
        messages = [*opening_messages(vf, data), vf.AssistantMessage(content=completion)]
        for i, message in enumerate(messages):
            parent = i - 1 if i else None
            trace.nodes.append(vf.MessageNode(parent=parent, message=message, sampled=message is messages[-1]))
        return trace


def opening_messages(vf: Any, data: Any) -> list[Any]:
    """What a row's trace opens with, before the model's first reply: its system prompt and prompt messages."""
    messages = [vf.SystemMessage(content=data.system_prompt)] if data.system_prompt else []
    messages += [vf.UserMessage(content=data.prompt)] if isinstance(data.prompt, str) else list(data.prompt or [])
    return messages
