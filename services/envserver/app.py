"""An OpenEnv server for the project's multi-turn tasks: any :class:`tba.tasks.MultiTurnTask` (the calculator,
a task of your own) served as an OpenEnv environment, so that trainers which speak OpenEnv, this one's
``openenv`` task included, can train on it.

One environment per WebSocket session (OpenEnv's ``/ws``). ``reset(seed)`` starts the episode of the
task's first training prompt of that seed (deterministic, as the ``openenv`` task needs) and answers with
the prompt's text; ``step({"text": turn})`` answers a model turn with the task's ``step``: the observation
to read next, or ``done`` with the episode's reward. The task's own limits (``max_turns``) are the
client's to enforce, as they are for any OpenEnv server.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any
from uuid import uuid4

from tba.tasks import MultiTurnTask, Prompt, make_task


def create_app(task_name: str, options: dict[str, Any] | None = None, max_sessions: int = 256) -> Any:
    """The FastAPI app serving ``task_name`` (with ``options``) to at most ``max_sessions`` sessions at once."""
    from openenv.core.env_server.http_server import create_fastapi_app
    from openenv.core.env_server.interfaces import Environment
    from openenv.core.env_server.types import Action, Observation, State

    made = make_task(task_name, options)
    if not isinstance(made, MultiTurnTask):
        raise ValueError(f"task {task_name!r} is single-turn: an environment server serves multi-turn tasks")
    task: MultiTurnTask = made

    class TextAction(Action):
        text: str

    class TextObservation(Observation):
        text: str = ""

    class TaskEnvironment(Environment):
        SUPPORTS_CONCURRENT_SESSIONS = True  # every session has its own episode: nothing is shared

        def __init__(self) -> None:
            super().__init__()
            self._state = State(episode_id=str(uuid4()), step_count=0)
            self._prompt: Prompt | None = None
            self._episode: Any = None

        def reset(self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any) -> TextObservation:
            self.close()
            self._prompt = next(iter(task.train_prompts(seed or 0)))
            self._episode = task.start(self._prompt)
            self._state = State(episode_id=episode_id or str(uuid4()), step_count=0)
            return TextObservation(text=self._prompt.text)

        def step(self, action: TextAction, timeout_s: float | None = None, **kwargs: Any) -> TextObservation:
            if self._prompt is None:
                raise ValueError("step before reset")
            self._state.step_count += 1
            answer = task.step(self._prompt, self._episode, action.text)
            return TextObservation(text=answer.observation, done=answer.done, reward=answer.reward)

        @property
        def state(self) -> State:
            return self._state

        def close(self) -> None:
            if self._prompt is not None:
                task.finish(self._episode)
                self._prompt = self._episode = None

    return create_fastapi_app(TaskEnvironment, TextAction, TextObservation, max_concurrent_envs=max_sessions)


ASGIApp = Callable[[MutableMapping[str, Any], Any, Any], Awaitable[None]]


def quiet_disconnects(app: ASGIApp) -> ASGIApp:
    """``app`` without a traceback per episode: OpenEnv's client sends ``close`` and hangs up at once, and the
    server's own close frame then finds the connection gone (starlette's ``WebSocketDisconnect``, uncaught in
    OpenEnv's ``/ws`` handler). The session is over either way; any other failure still propagates."""
    from starlette.websockets import WebSocketDisconnect

    async def wrapped(scope: MutableMapping[str, Any], receive: Any, send: Any) -> None:
        try:
            await app(scope, receive, send)
        except WebSocketDisconnect:
            if scope["type"] != "websocket":
                raise

    return wrapped
