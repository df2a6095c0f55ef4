"""OpenEnv environments (PyPI ``openenv-core``) as multi-turn tasks: a server reached over its client.

``TBA_TASK=openenv`` with ``TBA_TASK_OPTIONS='{"url": "http://envs:8000"}'``. An OpenEnv server holds one
environment per WebSocket session (``/ws``): ``reset(seed)`` starts an episode and returns its first
observation, ``step(action)`` answers the model's turn with an observation, a reward and whether the
episode is done. Here:

- a **prompt** is an episode's start: seed s is reset once to read its first observation, which is the
  prompt's text (``prompt_id`` ``seed-<s>``); the K episodes of a group each reset the same seed in a
  session of their own, so the server's ``reset`` must be deterministic in the seed (an episode whose
  first observation differs from its prompt fails, with that reason). Held-out prompts are those whose
  text a stable hash puts aside, as for the built-in tasks; their seeds are a range of their own;
- a **model turn** is sent as the action ``{action_field: turn}``, and the observation's
  ``observation_field`` (a string) is what the model reads next, through ``observation_template``;
- the **reward** is the episode's return, the sum of the rewards the server gave; an episode cut short by
  the turn or token budget (never ``done``) scores 0.

Failures are the environment's, never the searcher's: a server that does not answer within
``timeout_s``, answers something that is not an observation of that shape, or dies, raises here, which
ends that episode with the reason (:mod:`tba.model.episodes`). The server must take as many sessions at
once as a batch has episodes (P x S; ``max_concurrent_envs`` of OpenEnv's ``create_fastapi_app``).

The clients run on one event loop on a thread of their own (OpenEnv's client is asynchronous); each call
waits at most ``timeout_s``, and up to ``concurrent_steps`` episodes wait at once.
"""

from __future__ import annotations

import itertools
import logging
import math
import threading
import time
from collections.abc import Coroutine, Iterator
from typing import Any

from tba.tasks.base import Prompt, Step, check_fraction, is_held_out, register
from tba.tasks.loop import AsyncEnvironmentTask, LoopThread

log = logging.getLogger(__name__)
INSTALL = "pip install openenv-core==0.3.0 (or pip install -e '.[envs]')"
EVAL_SEEDS = 10**9  # the held-out prompts' seeds start here; training seeds stay below


def _client_class() -> Any:
    try:
        from openenv.core.generic_client import GenericEnvClient
    except ImportError:
        raise ValueError(f"task 'openenv' needs the openenv-core package: {INSTALL}") from None
    return GenericEnvClient


class BadAnswer(RuntimeError):
    """The environment server answered something this task cannot use."""


PROMPT_RETRIES = 5  # consecutive failed resets before drawing prompts gives up (the server is down)
RETRY_PAUSE_S = 0.5  # the first pause between them; it doubles


@register("openenv")
class OpenEnv(AsyncEnvironmentTask):
    def __init__(
        self,
        url: str,
        action_field: str = "text",
        observation_field: str = "text",
        observation_template: str = "{observation}",
        max_turns: int = 4,
        max_episode_tokens: int = 256,
        turn_stop: list[str] | None = None,
        timeout_s: float = 30.0,
        concurrent_steps: int = 64,
        held_out_fraction: float = 0.1,
    ) -> None:
        if not url.startswith(("http://", "https://", "ws://", "wss://")):
            raise ValueError(f"url must be the server's http(s):// or ws(s):// address, got {url!r}")
        self.set_episode_options(
            observation_template, max_turns, max_episode_tokens, turn_stop, timeout_s, concurrent_steps
        )
        self.client_class = _client_class()
        self.url, self.action_field, self.observation_field = url, action_field, observation_field
        self.held_out_fraction = check_fraction(held_out_fraction)
        self._loop: LoopThread | None = None
        self._loop_lock = threading.Lock()

    # --- the client ---
    def _run(self, coro: Coroutine[Any, Any, Any]) -> Any:
        with self._loop_lock:  # one loop for every client: a connection is bound to the loop that opened it
            if self._loop is None:
                self._loop = LoopThread("openenv-clients")
        return self._loop.run(coro, self.timeout_s)

    def _connect(self) -> Any:
        client = self.client_class(
            base_url=self.url, connect_timeout_s=self.timeout_s, message_timeout_s=self.timeout_s
        )
        self._run(client.connect())
        return client

    def _observe(self, result: Any) -> tuple[str, float | None, bool]:
        """(observation text, reward, done) of a step or reset result; raises on anything else."""
        obs = getattr(result, "observation", None)
        text = obs.get(self.observation_field) if isinstance(obs, dict) else None
        reward, done = getattr(result, "reward", None), getattr(result, "done", None)
        if not isinstance(text, str):
            raise BadAnswer(f"the observation has no string field {self.observation_field!r}: {obs!r:.200}")
        if reward is not None and not (isinstance(reward, int | float) and math.isfinite(reward)):
            raise BadAnswer(f"the reward is not a finite number: {reward!r:.50}")
        if not isinstance(done, bool):
            raise BadAnswer(f"done is not a boolean: {done!r:.50}")
        return text, None if reward is None else float(reward), done

    def _first_observation(self, client: Any, seed: int) -> str:
        text, _, done = self._observe(self._run(client.reset(seed=seed)))
        if done:
            raise BadAnswer(f"the episode of seed {seed} is done at its reset")
        return text

    # --- prompts ---
    def _prompts(self, seeds: Iterator[int], held_out: bool) -> Iterator[Prompt]:
        """The prompts of ``seeds`` on one side of the split. A failed reset is tried again on a new session
        after a pause (0.5, 1, 2... s); after :data:`PROMPT_RETRIES` in a row the server is taken for down."""
        client = None
        try:
            for seed in seeds:
                for attempt in range(PROMPT_RETRIES):
                    try:
                        client = client or self._connect()
                        text = self._first_observation(client, seed)
                        break
                    except Exception as err:  # noqa: BLE001 (retried, then raised with the server named)
                        if client is not None:
                            self._close(client)
                            client = None
                        if attempt == PROMPT_RETRIES - 1:
                            raise RuntimeError(
                                f"OpenEnv server {self.url}: reset(seed={seed}) failed {PROMPT_RETRIES} times in a "
                                f"row, the last with {type(err).__name__}: {err}"
                            ) from err
                        log.warning("OpenEnv server %s: reset(seed=%d) failed (%s); retrying", self.url, seed, err)
                        time.sleep(RETRY_PAUSE_S * 2**attempt)
                # Salted: a server's prompts may come from a stream already split by the same hash (tba envserver).
                if is_held_out(f"openenv:{text}", self.held_out_fraction) == held_out:
                    yield Prompt(f"seed-{seed}", text, "")
        finally:
            if client is not None:
                self._close(client)

    def train_prompts(self, seed: int) -> Iterator[Prompt]:
        return self._prompts(itertools.count(seed * 1_000_003 % EVAL_SEEDS), held_out=False)

    def eval_prompts(self, n: int) -> list[Prompt]:
        seeds = range(EVAL_SEEDS, EVAL_SEEDS + 1000 + int(100 * n / self.held_out_fraction))
        out: dict[str, Prompt] = {}
        for prompt in self._prompts(iter(seeds), held_out=True):
            out.setdefault(prompt.text, prompt)  # a text once, whichever seed gave it first
            if len(out) >= n:
                break
        return list(out.values())

    # --- episodes ---
    def start(self, prompt: Prompt) -> dict[str, Any]:
        client = self._connect()
        seed = int(prompt.prompt_id.removeprefix("seed-"))
        try:
            if self._first_observation(client, seed) != prompt.text:
                raise BadAnswer(f"reset(seed={seed}) is not deterministic: its first observation changed")
        except BaseException:
            self._close(client)
            raise
        return {"client": client, "return": 0.0}

    def step(self, prompt: Prompt, state: Any, turn: str) -> Step:
        text, reward, done = self._observe(self._run(state["client"].step({self.action_field: turn})))
        state["return"] += reward or 0.0
        if done:
            return Step(done=True, reward=state["return"])
        return Step(observation=self.observation_template.format(observation=text))

    def finish(self, state: Any) -> None:
        if state is not None:
            self._close(state["client"])

    def _close(self, client: Any) -> None:
        try:
            self._run(client.close())
        except Exception:  # noqa: BLE001 (a dead server's session is gone either way)
            pass

    def reward(self, prompt: Prompt, completion: str) -> float:
        return 0.0  # an episode the budget cut short: the server never said it was done
