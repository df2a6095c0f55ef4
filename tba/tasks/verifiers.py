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

Single-turn tasksets only: a taskset that exports its own ``Env`` (a multi-turn loop) is refused with that
reason.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Iterator
from typing import Any

from tba.tasks.base import Prompt, Task, check_fraction, is_held_out, register

INSTALL = "pip install verifiers==0.4.0 (or pip install -e '.[envs]')"


def _library() -> Any:
    try:
        import verifiers.v1 as vf
    except ImportError:
        raise ValueError(f"task 'verifiers' needs the verifiers package: {INSTALL}") from None
    return vf


@register("verifiers")
class Verifiers(Task):
    def __init__(
        self,
        env: str,
        args: dict[str, Any] | None = None,
        eval_args: dict[str, Any] | None = None,
        held_out_fraction: float = 0.1,
    ) -> None:
        vf = _library()
        self.vf, self.env_id = vf, env
        self.held_out_fraction = check_fraction(held_out_fraction)
        try:
            if vf.environment_class(env) is not vf.SingleAgentEnv:
                raise ValueError(f"verifiers environment {env!r} runs its own multi-turn loop: not supported yet")
            rows = self._load(args)
            held = self._load(eval_args) if eval_args is not None else None
        except (ImportError, AttributeError, TypeError) as err:
            raise ValueError(f"verifiers environment {env!r} could not be loaded: {err}") from None
        if held is None:
            held = [r for r in rows if is_held_out(r[0].text, self.held_out_fraction)]
            rows = [r for r in rows if not is_held_out(r[0].text, self.held_out_fraction)]
        if not rows or not held:
            raise ValueError(f"verifiers environment {env!r}: {len(rows)} training and {len(held)} held-out rows")
        self._train, self._held = [p for p, _ in rows], [p for p, _ in held]
        self._tasks = {p.prompt_id: task for p, task in [*rows, *held]}

    def _load(self, args: dict[str, Any] | None) -> list[tuple[Prompt, Any]]:
        """The taskset's rows under ``args``: (prompt, its verifiers task)."""
        vf = self.vf
        config_type = vf.taskset_config_type(self.env_id)
        try:
            config = config_type(id=self.env_id, **(args or {}))
        except Exception as err:  # noqa: BLE001 (pydantic's error names the field)
            raise ValueError(f"verifiers environment {self.env_id!r} refused args {args}: {err}") from None
        out = []
        for task in vf.load_taskset(config):
            data = task.data
            name = data.name or data.id or data.idx
            out.append((Prompt(f"{self.env_id}/{name}", self._text(data), str(getattr(data, "answer", ""))), task))
        return out

    def _text(self, data: Any) -> str:
        """The row's prompt as one user turn: the user text; in chat form after the row's system prompt."""
        if isinstance(data.prompt, str):
            user = data.prompt
        else:
            user = "\n\n".join(str(m.content) for m in data.prompt or [] if getattr(m, "role", "") == "user")
        if self.chat and data.system_prompt:
            return f"{data.system_prompt}\n\n{user}"
        return user

    def train_prompts(self, seed: int) -> Iterator[Prompt]:
        rng = random.Random(f"verifiers-{self.env_id}-{seed}")
        while True:
            order = list(self._train)
            rng.shuffle(order)
            yield from order

    def eval_prompts(self, n: int) -> list[Prompt]:
        return self._held[:n]

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
        messages = [vf.SystemMessage(content=data.system_prompt)] if data.system_prompt else []
        messages += [vf.UserMessage(content=data.prompt)] if isinstance(data.prompt, str) else list(data.prompt or [])
        messages.append(vf.AssistantMessage(content=completion))
        for i, message in enumerate(messages):
            parent = i - 1 if i else None
            trace.nodes.append(vf.MessageNode(parent=parent, message=message, sampled=message is messages[-1]))
        return trace
