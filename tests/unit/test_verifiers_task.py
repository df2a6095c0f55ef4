"""verifiers tasksets as tasks (tba/tasks/verifiers.py), on the real package and a taskset of the tests'
own (tests/envs/vf_sums.py), loaded by name as verifiers loads any; environments with a loop of their own
(tba/tasks/verifiers_env.py) on tests/envs/vf_followup.py, with scripted turns and in the episode runner."""

from __future__ import annotations

import asyncio
import math
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tba.model.episodes import run_episodes
from tba.model.tokenizer import CHARACTERS
from tba.tasks import MultiTurnTask, Prompt, Step, make_task
from tba.tasks.verifiers_env import VerifiersEnv
from tests.unit.test_episodes import TOK, scripted

ENVS = Path(__file__).resolve().parents[1] / "envs"


@pytest.fixture(autouse=True)
def envs_on_path(monkeypatch) -> None:
    monkeypatch.syspath_prepend(str(ENVS))


def test_a_taskset_by_name_gives_prompts_a_split_and_its_own_reward() -> None:
    task = make_task("verifiers", {"env": "vf-sums", "args": {"rows": 200}})
    assert not isinstance(task, MultiTurnTask)  # a single-turn taskset: one completion per sample
    held = task.eval_prompts(500)
    stream = task.train_prompts(seed=0)
    train = [next(stream) for _ in range(400)]  # two rounds of the training rows
    assert 5 < len(held) < 40 and not {p.prompt_id for p in held} & {p.prompt_id for p in train}
    assert len({p.prompt_id for p in train}) == 200 - len(held)
    assert train[:5] != [next(task.train_prompts(seed=1)) for _ in range(5)]  # each seed its own order
    p = held[0]
    assert p.text.endswith("=") and p.prompt_id.startswith("vf-sums/sum-")
    a, b = p.text.rstrip("=").split("+")
    right = str(int(a) + int(b))
    assert task.rewards(p, [right, f" {right} ", "12", ""]) == [1.0, 1.0, 0.0, 0.0]  # verifiers strips replies
    assert task.success(task.reward(p, right))


def test_a_config_of_its_own_for_the_held_out_rows() -> None:
    task = make_task("verifiers", {"env": "vf-sums", "args": {"rows": 50}, "eval_args": {"rows": 20, "seed": 7}})
    assert len(task.eval_prompts(100)) == 20
    stream = task.train_prompts(seed=0)
    assert len({next(stream).prompt_id for _ in range(50)}) == 50  # every training row, none held out


def test_the_chat_form_puts_the_rows_system_prompt_first_and_keeps_the_split() -> None:
    options = {"env": "vf-sums", "args": {"rows": 60, "system": "Add."}}
    plain, chat = make_task("verifiers", options), make_task("verifiers", options, chat=True)
    held_plain, held_chat = plain.eval_prompts(60), chat.eval_prompts(60)
    assert [p.prompt_id for p in held_plain] == [p.prompt_id for p in held_chat]
    assert held_chat[0].text == f"Add.\n\n{held_plain[0].text}" and held_plain[0].text.endswith("=")
    assert next(chat.train_prompts(seed=0)).text.startswith("Add.\n\n")


def test_bad_names_and_args_are_clear_errors() -> None:
    with pytest.raises(ValueError, match="'no-such-env' could not be loaded"):
        make_task("verifiers", {"env": "no-such-env"})
    with pytest.raises(ValueError, match="refused args"):
        make_task("verifiers", {"env": "vf-sums", "args": {"rows": "many"}})


def test_without_the_package_the_error_says_what_to_install(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "verifiers.v1", None)
    with pytest.raises(ValueError, match="pip install verifiers==0.4.0"):
        make_task("verifiers", {"env": "vf-sums"})


# --- environments that run their own loop ---


@pytest.fixture
def env_task() -> Iterator[Callable[..., VerifiersEnv]]:
    """Makes ``verifiers`` tasks of environments with a loop of their own (vf-followup unless ``env`` says
    otherwise), closing each."""
    made: list[VerifiersEnv] = []

    def make(env: str = "vf-followup", **options: Any) -> VerifiersEnv:
        task = make_task("verifiers", {"env": env, **options})
        assert isinstance(task, VerifiersEnv)
        made.append(task)
        return task

    yield make
    for task in made:
        task.close()


def running_sums(prompt: Prompt, addends: list[int]) -> list[str]:
    a, b = prompt.text.rstrip("=").split("+")
    sums = [int(a) + int(b)]
    for addend in addends:
        sums.append(sums[-1] + addend)
    return [str(s) for s in sums]


def tasks_on_the_loop(task: VerifiersEnv) -> int:
    """The coroutines still scheduled on the task's event loop (besides the one counting)."""

    async def count() -> int:
        return len(asyncio.all_tasks()) - 1

    return int(task._loop.run(count(), 5))


def test_a_multi_turn_env_plays_its_loop_with_the_models_turns_and_the_tasksets_reward(env_task) -> None:
    task = env_task(args={"rows": 60, "follow_ups": 2})
    assert issubclass(type(task), MultiTurnTask) and task.seat == "agent"
    held = task.eval_prompts(100)
    assert 0 < len(held) < 20 and not {p.prompt_id for p in held} & {next(task.train_prompts(0)).prompt_id}
    prompt = held[0]
    addends = task._tasks[prompt.prompt_id].data.addends
    first, second, _ = running_sums(prompt, addends)
    state = task.start(prompt)  # the env runs up to its first call on the seat: the reply to the row's prompt
    assert task.step(prompt, state, first).observation == f";+{addends[0]}="
    assert task.step(prompt, state, f" {second} ").observation == f";+{addends[1]}="
    end = task.step(prompt, state, "0")  # the second follow-up wrong
    assert end.done and end.observation == ""
    trace = state.trace  # the verifiers trace of the seat: scored by the taskset's own reward
    assert end.reward == trace.reward == trace.rewards["running_sums"].score == pytest.approx(2 / 3)
    roles = [(n.message.role, n.sampled) for n in trace.nodes]
    assert roles == [("user", False), ("assistant", True)] * 3
    assert [n.message.content for n in trace.nodes][::2] == [prompt.text, f";+{addends[0]}=", f";+{addends[1]}="]
    assert trace.ok and trace.stop_condition == "user_closed" and trace.agent.name == "agent"
    task.finish(state)
    assert tasks_on_the_loop(task) == 0


def test_the_turn_limit_ends_the_exchange_and_what_was_said_is_scored(env_task) -> None:
    task = env_task(args={"rows": 60, "follow_ups": 3}, max_turns=2)
    prompt = task.eval_prompts(1)[0]
    sums = running_sums(prompt, task._tasks[prompt.prompt_id].data.addends)
    state = task.start(prompt)
    task.step(prompt, state, sums[0])
    end = task.step(prompt, state, sums[1])  # the env asks a third turn: terminated, as a verifiers turn limit
    assert end.done and end.reward == pytest.approx(2 / 4)
    assert state.trace.stop_condition == "max_turns" and state.trace.num_turns == 2
    task.finish(state)


def test_an_env_that_fails_mid_run_ends_its_episode_with_the_error(env_task) -> None:
    task = env_task(env_args={"fail_at": 1})
    prompt = task.eval_prompts(1)[0]
    state = task.start(prompt)
    with pytest.raises(RuntimeError, match="the follow-up service broke"):
        task.step(prompt, state, "12")
    assert not state.trace.ok and state.trace.errors[0].message == "the follow-up service broke"
    task.finish(state)
    assert tasks_on_the_loop(task) == 0


def test_finish_cancels_a_pending_run_and_nothing_is_left_running(env_task) -> None:
    before = threading.active_count()
    task = env_task(env_args={"stall_at": 1}, timeout_s=1.0)
    prompts = task.eval_prompts(3)
    waiting = [task.start(p) for p in prompts]  # each run awaits the model's first turn
    stalled = waiting.pop()
    with pytest.raises(TimeoutError, match="no answer within 1 s"):
        task.step(prompts[-1], stalled, "12")  # the env never answers: the episode ends, the searcher goes on
    for state in [*waiting, stalled]:
        task.finish(state)
        assert state.driver.cancelled() and not state.trace.is_completed  # cancelled, never scored
    assert tasks_on_the_loop(task) == 0
    assert threading.active_count() == before + 1  # the task's one loop thread
    task.close()
    assert threading.active_count() == before and not task._loop.thread.is_alive()


def test_envs_the_searcher_cannot_play_are_refused_or_fail_with_the_reason(env_task) -> None:
    before = threading.active_count()
    with pytest.raises(ValueError, match=r"not trained: 'user' \(harness 'null'\).*model endpoint"):
        make_task("verifiers", {"env": "vf-sums", "env_id": "user-sim"})  # its user is another model's agent
    with pytest.raises(ValueError, match=r"trains 2 seats \('first', 'second'\): an episode here is one conversation"):
        make_task("verifiers", {"env": "vf-sums", "env_id": "vf-two-seats"})
    with pytest.raises(ValueError, match="refused env_args"):
        env_task(env_args={"fail_at": "often"})
    with pytest.raises(ValueError, match="'no-such-env' could not be loaded"):
        make_task("verifiers", {"env": "vf-sums", "env_id": "no-such-env"})
    assert threading.active_count() == before  # a refused task leaves no loop behind
    speaks_first = env_task(env_args={"speaks_first": True})
    with pytest.raises(ValueError, match="opened the trained seat's conversation with a message of its own"):
        speaks_first.start(speaks_first.eval_prompts(1)[0])  # the first turn was generated from the row's prompt
    assert tasks_on_the_loop(speaks_first) == 0
    best_of_two = env_task("vf-sums", env_id="best-of-n", env_args={"n": 2})
    prompt = best_of_two.eval_prompts(1)[0]
    state = best_of_two.start(prompt)
    with pytest.raises(RuntimeError, match="played the trained seat 'agent' a second time"):
        best_of_two.step(prompt, state, "12")
    best_of_two.finish(state)


def test_a_built_in_env_over_a_plain_taskset_plays_one_turn(env_task) -> None:
    """best-of-n with one attempt: verifiers' own Env, run here, its one attempt the model's."""
    task = env_task("vf-sums", env_id="best-of-n", env_args={"n": 1})
    prompt = task.eval_prompts(1)[0]
    a, b = prompt.text.rstrip("=").split("+")
    state = task.start(prompt)
    assert task.step(prompt, state, str(int(a) + int(b))) == Step(done=True, reward=1.0)
    assert state.trace.stop_condition == "agent_completed"
    task.finish(state)


def test_the_episode_runner_plays_the_env_with_its_messages_as_environment_spans(env_task) -> None:
    """run_episodes over the task, turns scripted on the tiny model's tokenizer: one trajectory per episode,
    the follow-up the environment wrote marked as its span, the reward the taskset's."""
    task = env_task(args={"rows": 60})
    prompt = task.eval_prompts(1)[0]
    (addend,) = task._tasks[prompt.prompt_id].data.addends
    first, second = running_sums(prompt, [addend])
    asked = f"{prompt.text}{first};+{addend}="
    script = {prompt.text: [first, "7"], asked: [second], f"{prompt.text}7;+{addend}=": ["0"]}
    ids = TOK.encode(prompt.text)
    right, wrong = run_episodes(scripted(script), task, TOK, [prompt], [ids], 2, 12, 48)[0]
    observation = len(first) + 1  # the model's first turn and its EOS come first
    assert right.env_spans == [[observation, observation + 4]]
    assert TOK.decode(right.token_ids[observation : observation + 4]) == f";+{addend}="
    assert TOK.decode(right.token_ids, skip_special_tokens=True) == asked.removeprefix(prompt.text) + second
    assert (right.reward, right.turns, right.finish_reason, right.failure) == (1.0, 2, "stop", None)
    assert (wrong.reward, wrong.turns) == (0.0, 2)  # "7", then "0"
    assert tasks_on_the_loop(task) == 0


def test_the_tiny_model_plays_the_env_in_the_episode_runner(env_task, tiny_model: Path) -> None:
    """The real tiny model (untrained) generates every turn: each character ends a turn (``turn_stop``), so every
    episode takes both turns and carries the environment's follow-up as its one span."""
    from tba.model.evaluation import _turns, load_model

    model, tokenizer = load_model(tiny_model)
    task = env_task(args={"rows": 60}, turn_stop=list(CHARACTERS))
    prompts = task.eval_prompts(2)
    ids = [tokenizer.encode(p.text) for p in prompts]
    groups = run_episodes(_turns(model, tokenizer, task.turn_stop, 1.0, 0), task, tokenizer, prompts, ids, 2, 8, 32)
    for prompt, group in zip(prompts, groups, strict=True):
        (addend,) = task._tasks[prompt.prompt_id].data.addends
        for t in group:
            assert t.failure is None and t.turns == 2 and t.reward in (0.0, 0.5, 1.0)
            assert t.env_spans == [[1, 5]] and tokenizer.decode(t.token_ids[1:5]) == f";+{addend}="
            assert math.isnan(t.logprob_sum)  # decoded by the evaluation's generator, which reports none
    assert tasks_on_the_loop(task) == 0
