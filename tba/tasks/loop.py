"""An asyncio event loop on a daemon thread: how a synchronous caller (the episode runner's threads) drives an
environment's async code (OpenEnv clients, a verifiers ``Env``) with a timeout on every call, so that an
environment that never answers ends its own episode only; and the episode options every such environment
takes."""

from __future__ import annotations

import asyncio
import math
import threading
from collections.abc import Coroutine
from typing import Any

from tba.tasks.base import MultiTurnTask


class LoopThread:
    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self.thread.start()

    def run(self, coro: Coroutine[Any, Any, Any], timeout: float) -> Any:
        """``coro``'s result, run on the loop; TimeoutError (the coroutine cancelled) after ``timeout`` seconds."""
        future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return future.result(timeout)
        except TimeoutError:
            future.cancel()
            raise TimeoutError(f"no answer within {timeout:g} s") from None

    def close(self) -> None:
        """Cancel what still runs on the loop, then stop it and its thread."""
        if not self.thread.is_alive():
            return

        async def cancel_all() -> None:
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for t in tasks:
                t.cancel()
            if tasks:
                await asyncio.wait(tasks, timeout=5)

        try:
            self.run(cancel_all(), 10)
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(10)
            if not self.thread.is_alive():
                self.loop.close()


class AsyncEnvironmentTask(MultiTurnTask):
    """A multi-turn task whose environment answers through async code (OpenEnv, verifiers): the options every
    such task takes, besides the bounds of every multi-turn task."""

    observation_template: str = "{observation}"  # how an observation is shown to the model
    timeout_s: float = 30.0  # how long one call on the environment may wait

    def set_episode_options(
        self,
        observation_template: str,
        max_turns: int,
        max_episode_tokens: int,
        turn_stop: list[str] | None,
        timeout_s: float,
        concurrent_steps: int,
    ) -> None:
        """Check and set the turn and token bounds, the turn's stop strings, how an observation is shown, how
        long a call may wait and how many episodes may wait at once."""
        if not (math.isfinite(timeout_s) and 0 < timeout_s <= 3600):
            raise ValueError(f"timeout_s must be in (0, 3600], got {timeout_s}")
        if max_turns < 1 or max_episode_tokens < 1 or not 1 <= concurrent_steps <= 4096:
            raise ValueError("max_turns and max_episode_tokens must be at least 1, concurrent_steps in [1, 4096]")
        if "{observation}" not in observation_template:
            raise ValueError("observation_template must hold {observation}")
        self.max_turns, self.max_episode_tokens, self.concurrent_steps = max_turns, max_episode_tokens, concurrent_steps
        self.turn_stop = tuple(turn_stop or ())
        self.observation_template, self.timeout_s = observation_template, timeout_s
