"""verifiers environments that run their own loop (an ``Env`` subclass's ``run(task, agents)``) as multi-turn
tasks: the environment's code runs in the searcher, and the model's turns are its trained seat's.

``TBA_TASK=verifiers`` with ``{"env": "my-env", ...}`` makes this task when the taskset's environment is not
the plain single-agent one: the taskset exports an ``Env`` subclass, or ``env_id`` pairs it with one
(verifiers' ``--env.id``); ``env_args`` are that environment's config fields. In verifiers an ``Env`` drives
*agents*, each an agent program launched against a model endpoint; here nothing is launched. Each episode
runs ``setup`` and ``run`` of the ``Env`` on an event loop of the task's own (one thread), handing it agents
whose trained seat is the searcher's model:

- ``agents.<seat>.interaction(task)`` yields an exchange whose ``turn(message)`` is answered by the model's
  next turn: ``message`` (a string or messages) becomes the episode's observation (through
  ``observation_template``), the model's turn comes back as the ``Segment``'s assistant message.
  ``agents.<seat>.run(task)`` is the one-turn case. The exchange keeps a real verifiers ``Trace`` (the
  task's prompt, the messages, the model's replies), scored by the task's ``score`` when it closes, as
  verifiers scores a rollout (without a runtime: rewards that need a sandbox are skipped).
- The episode's first model turn is generated from the row's prompt before the environment runs, so the
  environment's first call on the seat must take the reply to that prompt: a bare ``turn()`` (or ``run``) on
  a task whose prompt is the row's. An environment that opens with a message of its own fails its episode,
  saying so.
- The episode is done when ``run`` returns (after the env's ``finalize``, which may judge the trace); its
  reward is the trained seat's ``trace.reward``. An exception in ``run``, a trace that failed (its scoring
  raised), or an environment that does not answer within ``timeout_s`` ends that episode only: ``step``
  raises and the episode runner counts it. ``finish`` cancels a ``run`` still under way.
- Turns are bounded as every multi-turn task's: past ``max_turns`` (or the seat's own ``max_turns``, the
  smaller) the seat's next ``turn`` comes back ``terminated``, as a verifiers turn limit does, and the
  environment decides what that means; the runner's token budget still cuts an episode (reward 0).

Refused when the task is made, with the reason: a config whose seats are more than the one trained seat. A
seat the ``Env``'s ``setup`` does not train (user-sim's modeled user, agentic-judge's judge) is an agent
program that calls a model endpoint of its own, which the searcher does not serve; two trained seats would be
two conversations, where an episode here is one. Failing each episode instead, with the reason: a second run
of the trained seat in one episode (best-of-n with ``n`` above 1), a borrowed runtime, tool servers or
artifact collection (a sandbox: isolated-verifier), and steering (``send``/``steer``: a turn here is
generated whole).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from tba.tasks.base import Prompt, Step, register
from tba.tasks.loop import AsyncEnvironmentTask, LoopThread
from tba.tasks.verifiers import Verifiers, library, opening_messages, runs_own_loop

log = logging.getLogger(__name__)


@dataclass
class _Ask:
    """The environment asks the trained seat for a turn: the reply to ``text`` (None: the opening, the reply to
    ``task``'s own prompt)."""

    text: str | None
    task: Any
    reply: asyncio.Future[str]


@dataclass
class _End:
    """``run`` is over: the trained seat's reward, or why the episode failed."""

    reward: float = 0.0
    error: BaseException | None = None


@dataclass
class _Episode:
    """One episode: what links the environment's coroutine (on the loop) to the episode runner's thread."""

    events: asyncio.Queue[_Ask | _End] = field(default_factory=asyncio.Queue)
    driver: asyncio.Task[None] | None = None  # setup, run and finalize of the Env
    reply: asyncio.Future[str] | None = None  # the trained seat's turn the environment waits for
    trace: Any = None  # the trained seat's verifiers Trace, once its exchange is open

    async def ask(self, text: str | None, task: Any) -> str:
        reply: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self.events.put_nowait(_Ask(text, task, reply))
        return await reply


class VerifiersEnv(Verifiers, AsyncEnvironmentTask):
    """A verifiers taskset whose ``Env`` runs its own loop, played in the searcher (module docstring)."""

    def __init__(
        self,
        env: str,
        env_id: str = "",
        env_args: dict[str, Any] | None = None,
        max_turns: int = 4,
        max_episode_tokens: int = 256,
        turn_stop: list[str] | None = None,
        observation_template: str = "{observation}",
        timeout_s: float = 60.0,
        concurrent_steps: int = 64,
        **taskset: Any,
    ) -> None:
        """``taskset``: the options of the taskset, as a single-turn one takes them (``args``, ``eval_args``,
        ``held_out_fraction``)."""
        self.set_episode_options(
            observation_template, max_turns, max_episode_tokens, turn_stop, timeout_s, concurrent_steps
        )
        super().__init__(env, **taskset)
        self.environment = self._environment(env_id, taskset.get("args"), env_args)
        self.label = f"{type(self.environment).__name__} ({self.environment.config.env_id})"
        self._loop = LoopThread("verifiers-env")
        try:
            self.seat = self._trained_seat()
        except BaseException:
            self.close()
            raise

    def _environment(self, env_id: str, args: dict[str, Any] | None, env_args: dict[str, Any] | None) -> Any:
        """The ``Env`` as verifiers builds it: its config (the taskset's under ``args``, its own fields)."""
        vf = self.vf
        data = {**(env_args or {}), "id": env_id, "taskset": {**(args or {}), "id": self.env_id}}
        try:
            config = vf.resolve_env_config(data)
        except Exception as err:  # noqa: BLE001 (pydantic's error names the field)
            raise ValueError(
                f"verifiers environment {env_id or self.env_id!r} refused env_args {env_args}: {err}"
            ) from None
        return vf.load_environment(config)

    def _trained_seat(self) -> str:
        """The config's one seat, trained; any other configuration is refused with the reason. The env's
        ``setup`` (which marks the seats it does not train) runs on stand-ins to see which seats it trains."""
        config = self.environment.config
        harnesses = config.agent_harnesses()  # every seat the config declares, with its agent program
        seats = {name: _Seat(self, name, getattr(config, name), None) for name in harnesses}
        self._loop.run(self.environment.setup(self.vf.Agents(config, lambda name, spec: seats[name])), self.timeout_s)
        fixed = [name for name, seat in seats.items() if not seat.trainable]
        if fixed:
            named = ", ".join(f"{name!r} (harness {harnesses[name].id!r})" for name in fixed)
            raise ValueError(
                f"verifiers environment {self.label} plays seats that are not trained: {named}. Each is an agent "
                "program (its harness) that calls a model endpoint of its own, which the searcher does not serve: "
                "here an episode is the trained seat's conversation with the environment's code"
            )
        if len(seats) != 1:
            raise ValueError(
                f"verifiers environment {self.label} trains {len(seats)} seats ({', '.join(map(repr, seats))}): "
                "an episode here is one conversation, the one seat's, as the searcher generates it"
            )
        return next(iter(seats))

    def close(self) -> None:
        """Stop the event loop and its thread (episodes still under way are cancelled); the task is done."""
        self._loop.close()

    # --- episodes ---
    def start(self, prompt: Prompt) -> _Episode:
        episode = _Episode()
        try:
            self._loop.run(self._begin(episode, self._tasks[prompt.prompt_id]), self.timeout_s)
        except BaseException:
            self.finish(episode)  # the runner releases only the episodes that started
            raise
        return episode

    def step(self, prompt: Prompt, state: Any, turn: str) -> Step:
        step: Step = self._loop.run(self._answer(state, turn), self.timeout_s)
        return step

    def finish(self, state: Any) -> None:
        if state is None:
            return
        try:
            self._loop.run(self._cancel(state), self.timeout_s)
        except Exception as err:  # noqa: BLE001 (a run that ignores its cancellation is logged, not raised)
            log.warning("verifiers environment %s: an episode's run did not stop: %s", self.label, err)

    def reward(self, prompt: Prompt, completion: str) -> float:
        return 0.0  # an episode the token budget cut short: the environment never finished it

    def rewards(self, prompt: Prompt, completions: list[str]) -> list[float]:
        return [self.reward(prompt, c) for c in completions]

    # --- on the loop ---
    async def _begin(self, episode: _Episode, seed: Any) -> None:
        """Start the Env's run and take its first call on the seat: the reply to the row's prompt."""
        episode.driver = asyncio.create_task(self._drive(episode, seed))
        event = await episode.events.get()
        if isinstance(event, _End):
            raise event.error or RuntimeError(f"{self.label}: run() ended without taking the trained seat's turn")
        if event.text is not None:
            raise ValueError(
                f"{self.label}: run() opened the trained seat's conversation with a message of its own "
                f"({event.text[:80]!r}); the searcher generates the first turn from the row's prompt, so the seat's "
                "first turn must answer its task's own prompt (a bare turn() or run(task))"
            )
        if self._text(event.task.data) != self._text(seed.data):
            raise ValueError(
                f"{self.label}: run() handed the trained seat a task whose prompt is not the row's, which the "
                "searcher generated the first turn from"
            )
        episode.reply = event.reply

    async def _answer(self, episode: _Episode, turn: str) -> Step:
        """Hand the model's turn to the environment; its next call on the seat, or the end of its run."""
        if episode.reply is not None and not episode.reply.done():  # done: the run was cancelled from within
            episode.reply.set_result(turn)
        episode.reply = None
        event = await episode.events.get()
        if isinstance(event, _End):
            if event.error is not None:
                raise event.error
            return Step(done=True, reward=event.reward)
        if event.text is None:  # the one exchange's opening was taken in _begin
            raise RuntimeError(f"{self.label}: the trained seat was asked to open a second conversation")
        episode.reply = event.reply
        return Step(observation=self.observation_template.replace("{observation}", event.text))

    async def _drive(self, episode: _Episode, seed: Any) -> None:
        """One episode of the Env, as verifiers runs one (``setup``, ``run``, ``finalize``) over stand-in agents;
        its end, the trained seat's reward or the failure, goes to the runner."""
        vf, env = self.vf, self.environment
        try:
            agents = vf.Agents(env.config, lambda name, spec: _Seat(self, name, spec, episode))
            await env.setup(agents)
            await env.run(seed, agents)
            if episode.trace is None:
                raise RuntimeError(f"{self.label}: run() returned before the trained seat {self.seat!r} took a turn")
            task = vf.TraceTask(type=type(seed).__name__, data=seed.data, key=seed.key, hash=seed.hash)
            finished = vf.Episode(env=vf.EnvInfo(id=env.config.env_id), task=task, traces=[episode.trace])
            await env.finalize(seed, finished)
            trace = finished.traces[-1]  # finalize may replace it (a regraded trace)
            if not trace.ok:
                error = trace.last_error
                detail = f"{error.type}: {error.message}" if error else "no error recorded"
                raise RuntimeError(f"the trained seat's trace failed: {detail}")
            end = _End(reward=float(trace.reward))
        except Exception as err:  # noqa: BLE001 (the environment's failure ends its episode only)
            while isinstance(err, ExceptionGroup):
                err = err.exceptions[0]  # a TaskGroup's failures, by the first one's own name
            end = _End(error=err)
        episode.events.put_nowait(end)

    @staticmethod
    async def _cancel(episode: _Episode) -> None:
        if episode.driver is not None:
            episode.driver.cancel()
            await asyncio.wait([episode.driver])


class _Seat:
    """One seat of the Env's config as its ``run`` sees it (``agents.<seat>``): the trained seat's turns are the
    searcher's model's. A stand-in for verifiers' agent: the calls an environment makes on a seat to play it
    (``run``, ``interaction``, ``trainable``, ``config``, ``name``); anything else is refused by name."""

    def __init__(self, owner: VerifiersEnv, name: str, config: Any, episode: _Episode | None) -> None:
        self.owner, self.name, self.config, self.episode = owner, name, config, episode
        self.trainable = True  # the Env's setup() marks a seat it does not train

    def __getattr__(self, attr: str) -> Any:
        raise AttributeError(
            f"agent {self.__dict__.get('name')!r} has no {attr!r} here: the searcher plays the trained seat's turns "
            "itself, through run() and interaction()"
        )

    async def run(
        self,
        task: Any,
        *,
        runtime: Any = None,
        tools: Any = None,
        on_trace: Any = None,
        collect_artifacts: bool = False,
    ) -> Any:
        """One turn on the task's prompt, as verifiers' one-segment rollout: the scored trace."""
        if collect_artifacts:
            raise ValueError(f"agent {self.name!r}: collecting artifacts takes a sandbox, which the searcher has not")
        async with self.interaction(task, runtime=runtime, tools=tools, on_trace=on_trace) as exchange:
            await exchange.turn()
            exchange.trace.stop("agent_completed")
        return exchange.trace

    @asynccontextmanager
    async def interaction(
        self, task: Any, *, runtime: Any = None, tools: Any = None, on_trace: Any = None
    ) -> AsyncIterator[_Exchange]:
        """The seat's conversation on ``task``, closed (and scored) when the block ends; cancelled, unscored."""
        exchange = self._open(task, runtime, tools)
        if on_trace is not None:
            on_trace(exchange.trace)
        try:
            yield exchange
        except Exception as err:
            exchange.fail(err)
            await exchange.close()
            raise
        except BaseException:
            exchange.closed = True  # cancelled: nothing is scored
            raise
        await exchange.close()

    def _open(self, task: Any, runtime: Any, tools: Any) -> _Exchange:
        if runtime is not None or tools:
            raise ValueError(
                f"agent {self.name!r}: a borrowed runtime and tool servers need a sandbox; the searcher generates the "
                "trained seat's turns as plain text, without one"
            )
        episode = self.episode
        if episode is None or self.name != self.owner.seat:
            raise RuntimeError(f"agent {self.name!r} is not the trained seat of an episode")
        if episode.trace is not None:
            raise RuntimeError(
                f"{self.owner.label}: run() played the trained seat {self.name!r} a second time; an episode here is "
                "one conversation, the searcher's trajectory"
            )
        exchange = _Exchange(self, task, episode)
        episode.trace = exchange.trace
        return exchange


class _Exchange:
    """The trained seat's conversation, as ``agents.<seat>.interaction(task)`` yields it (verifiers'
    ``Interaction``): each ``turn`` is answered by the model's next turn, and a verifiers ``Trace`` records it
    (the task's prompt, the environment's messages, the model's sampled replies)."""

    def __init__(self, seat: _Seat, task: Any, episode: _Episode) -> None:
        from verifiers.v1.session import hook_boundary
        from verifiers.v1.state import state_cls

        vf = self.vf = seat.owner.vf
        self.task, self.episode = task, episode
        self.trace = vf.Trace(
            task=vf.TraceTask(type=type(task).__name__, data=task.data, key=task.key, hash=task.hash),
            state=state_cls(type(task))(),
            agent=vf.AgentInfo(config=seat.config, name=seat.name, trainable=seat.trainable),
        )
        for message in opening_messages(vf, task.data):
            self._append(message, sampled=False)
        self.limit = min(seat.owner.max_turns, seat.config.max_turns or seat.owner.max_turns)
        # The task's @stop hooks that read the trace (those that read a model request have none to read here).
        self.stops = [fn for fn in task.hooks("stop") if hook_boundary(fn, allow_trace=True) is vf.Trace]
        self.lock = asyncio.Lock()
        self.started = self.over = self.closed = self.failed = False

    def _append(self, message: Any, sampled: bool) -> None:
        nodes = self.trace.nodes
        nodes.append(self.vf.MessageNode(parent=len(nodes) - 1 if nodes else None, message=message, sampled=sampled))

    async def turn(self, message: Any = None) -> Any:
        """Send the seat one message (None: take the reply to the task's own prompt) and return the model's reply
        as a ``Segment``; ``terminated`` (no reply) once the turn limit or a ``@stop`` ends the exchange."""
        from verifiers.v1.dialects import parse_message
        from verifiers.v1.types import content_text

        vf = self.vf
        async with self.lock:
            if self.closed:
                raise RuntimeError("this interaction is closed")
            if self.over:
                raise RuntimeError("the exchange is over (the run ended); read interaction.trace")
            prompted = not self.started and self.trace.task.data.prompt is not None
            if message is None and not prompted:
                raise ValueError("nothing to run a turn on: a bare turn() takes a prompted task's opening reply")
            if message is not None and prompted:
                raise ValueError("the task's prompt opens this exchange: take its first reply with a bare turn()")
            if self.started and await self._refused():
                self.over = True
                return vf.Segment(messages=[], terminated=True)
            self.started = True
            messages = [vf.UserMessage(content=message)] if isinstance(message, str) else list(message or [])
            messages = [parse_message(m) if isinstance(m, dict) else m for m in messages]
            for m in messages:
                self._append(m, sampled=False)
            text = None if message is None else "\n\n".join(content_text(m.content) for m in messages)
            reply = vf.AssistantMessage(content=await self.episode.ask(text, self.task))
            self._append(reply, sampled=True)
            return vf.Segment(messages=[reply])

    async def _refused(self) -> bool:
        """Whether the exchange ends before the seat's next turn: its turn limit or a ``@stop`` (verifiers' own
        check before each model call; the opening turn, generated before the environment ran, is never refused)."""
        from verifiers.v1.session import call_hook

        if self.trace.num_turns >= self.limit:
            self.trace.stop("max_turns")
            return True
        for stop in self.stops:
            if await call_hook(stop, {self.vf.Trace: self.trace}):
                self.trace.stop(stop.__name__)
                return True
        return False

    async def send(self, message: str, **_: Any) -> dict[str, Any]:
        raise RuntimeError("steering is not supported here: a model turn is generated whole; use turn(message)")

    steer = send

    def fail(self, error: Exception) -> None:
        self.failed = True
        self.trace.record_error(error)

    async def close(self) -> Any:
        """End the exchange and score its trace with the task's rewards (not after a failure), once."""
        if not self.closed:
            self.closed = True
            if not self.failed:
                self.trace.stop("user_closed")  # the first stop condition stands
                try:
                    await self.task.score(self.trace)
                except Exception as err:  # noqa: BLE001 (a scoring failure fails the trace, as in verifiers)
                    self.fail(err)
            self.trace.is_completed, self.trace.ok = True, not self.failed
        return self.trace


def verifiers_task(env: str, **options: Any) -> Verifiers:
    """``TBA_TASK=verifiers``: either kind, by what the taskset is: a single-turn :class:`Verifiers`, or a
    :class:`VerifiersEnv` where its environment runs a loop of its own (``env_id`` may pair it with one)."""
    kind = VerifiersEnv if runs_own_loop(library(), env, options.get("env_id", "")) else Verifiers
    return kind(env, **options)


register("verifiers")(verifiers_task)
