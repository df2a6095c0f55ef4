"""Multi-turn episodes: the model's turns and the environment's steps, as one token sequence.

One runner for every generator: the searcher's vLLM engine and the held-out evaluation's greedy decoding
each hand it a :data:`GenerateTurns` function, so an episode is the same thing where it is generated and
where it is evaluated. Every turn of every live episode is generated in one call (the first turn draws
the group's ``n`` samples of each prompt at once); then each episode's environment answers its turn
(:meth:`tba.tasks.MultiTurnTask.step`), up to the task's ``concurrent_steps`` episodes at once (an
environment behind a network answers many sessions in parallel; one in-process is best called in turn).
An observation is tokenized and appended to the context, and its range is recorded as an environment
span: the trainer and the reference pass sum the model's tokens only.

The model's tokens are kept exactly as generated (never decoded and encoded again), so the log-probs the
trainer computes are of the very tokens the behaviour policy chose. An episode ends when the environment
says ``done``, after ``max_turns`` model turns, when its token budget is spent (finish ``length``), or
when the environment fails (finish ``abort``, with the failure's reason: the searcher drops and counts
it).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from tba.tasks import MultiTurnTask, Prompt

log = logging.getLogger(__name__)

# What can end an episode early: the environment's start or step raising, or a generation that failed.
FAILURE_KINDS = ("start", "step", "generation")
# One generated turn: its token ids (EOS or the stop string included when emitted), the sum of their
# behaviour log-probs (NaN where the generator does not report them), and why it ended: "stop" (EOS or a
# turn-ending string), "length" (its token budget) or anything else (the generator failed).
Turn = tuple[list[int], float, str]
# contexts (token ids), samples per context, per-context token budgets -> per context, its samples' turns
GenerateTurns = Callable[[list[list[int]], int, list[int]], list[list[Turn]]]


@dataclass
class Trajectory:
    """One episode as the trainer takes it: a completion of the prompt with the environment's spans."""

    token_ids: list[int] = field(default_factory=list)
    env_spans: list[list[int]] = field(default_factory=list)
    logprob_sum: float = 0.0
    finish_reason: str = "stop"
    reward: float | None = None  # the environment's; None: the task's reward() of the whole text
    turns: int = 0
    failure: str | None = None  # why the environment or a turn failed (the episode is not trained on)
    failure_kind: str | None = None  # one of FAILURE_KINDS: what failed, for counting


@dataclass
class _Episode:
    prompt: Prompt
    prompt_ids: list[int]
    state: Any
    trajectory: Trajectory


def run_episodes(
    generate: GenerateTurns,
    task: MultiTurnTask,
    tokenizer: Any,
    prompts: Sequence[Prompt],
    prompt_ids: Sequence[Sequence[int]],
    n: int,
    max_new_tokens: int,
    max_episode_tokens: int,
) -> list[list[Trajectory]]:
    """``n`` episodes of each prompt, in prompt order; ``max_new_tokens`` bounds a turn, ``max_episode_tokens``
    the trajectory (the model's tokens and the observations together)."""
    groups: list[list[_Episode]] = [[] for _ in prompts]
    first = generate([list(ids) for ids in prompt_ids], n, [min(max_new_tokens, max_episode_tokens)] * len(prompts))
    live: list[tuple[_Episode, Turn]] = []
    for p, (prompt, ids, turns) in enumerate(zip(prompts, prompt_ids, first, strict=True)):
        for turn in turns:
            episode = _Episode(prompt, list(ids), None, Trajectory())
            groups[p].append(episode)
            live.append((episode, turn))
    episodes = [e for e, _ in live]
    with ThreadPoolExecutor(max(1, task.concurrent_steps)) as pool:
        try:
            started = pool.map(lambda e: _start(task, e), episodes)
            live = [(e, turn) for (e, turn), ok in zip(live, started, strict=True) if ok]
            while live:
                going = pool.map(lambda et: _take_turn(task, tokenizer, et[0], et[1], max_episode_tokens), live)
                waiting = [e for (e, _), goes_on in zip(live, going, strict=True) if goes_on]
                if not waiting:
                    break
                contexts = [e.prompt_ids + e.trajectory.token_ids for e in waiting]
                budgets = [min(max_new_tokens, max_episode_tokens - len(e.trajectory.token_ids)) for e in waiting]
                live = [(e, turns[0]) for e, turns in zip(waiting, generate(contexts, 1, budgets), strict=True)]
        finally:
            list(pool.map(lambda e: _finish(task, e), episodes))
    return [[e.trajectory for e in group] for group in groups]


def _start(task: MultiTurnTask, episode: _Episode) -> bool:
    """The episode's state from the environment; False (the episode ended, failed) when it raises."""
    try:
        episode.state = task.start(episode.prompt)
        return True
    except Exception as err:  # noqa: BLE001 (the environment's failure ends its episode only)
        _fail(episode.trajectory, "start", err)
        return False


def _take_turn(task: MultiTurnTask, tokenizer: Any, episode: _Episode, turn: Turn, max_episode_tokens: int) -> bool:
    """Append the model's turn and the environment's answer; True when the episode goes on."""
    ids, logprob_sum, finish = turn
    t = episode.trajectory
    t.token_ids += ids
    t.logprob_sum += logprob_sum
    t.turns += 1
    if finish not in ("stop", "length") or not ids:
        _fail(t, "generation", RuntimeError(f"turn {t.turns} ended with {finish!r} after {len(ids)} tokens"))
        return False
    try:
        step = task.step(episode.prompt, episode.state, tokenizer.decode(ids, skip_special_tokens=True))
    except Exception as err:  # noqa: BLE001 (the environment's failure ends its episode only)
        _fail(t, "step", err)
        return False
    if step.done:
        t.reward = step.reward
        return False
    observation = tokenizer.encode(step.observation, add_special_tokens=False) if step.observation else []
    left = max_episode_tokens - len(t.token_ids) - len(observation)
    if finish == "length" or t.turns >= task.max_turns or left <= 0:
        t.finish_reason = "length"  # out of turns or tokens before the environment's end
        return False
    if observation:
        t.env_spans.append([len(t.token_ids), len(t.token_ids) + len(observation)])
        t.token_ids += observation
    return True


def _fail(t: Trajectory, kind: str, err: Exception) -> None:
    t.finish_reason, t.failure_kind = "abort", kind
    t.failure = f"{kind} (turn {t.turns}): {type(err).__name__}: {err}"[:300]
    log.warning("an episode ended early: %s", t.failure)


def _finish(task: MultiTurnTask, episode: _Episode) -> None:
    try:
        task.finish(episode.state)
    except Exception as err:  # noqa: BLE001
        log.warning("the environment failed to release an episode: %s", err)
