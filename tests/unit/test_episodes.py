"""Multi-turn episodes (tba/model/episodes.py) and the calculator task, with scripted turns: the runner's
bookkeeping is pure logic; the real engine runs it in tests/e2e/test_environments.py."""

from __future__ import annotations

import math
from typing import Any

import pytest

from tba.model.episodes import Trajectory, run_episodes
from tba.model.tokenizer import build_tokenizer
from tba.tasks import MultiTurnTask, Prompt, Step, make_task
from tba.tasks.calculator import calculate, tool_call

TOK = build_tokenizer()
EOS = TOK.eos_token_id


def scripted(replies: dict[str, list[str]], finish: str = "stop"):
    """Turns by script: the context's text (after the prompt) -> the texts its samples answer, each worth a
    log-prob of -1 per token; EOS ends a reply that does not end with the tool call's ``]``."""
    calls: list[tuple[list[str], int, list[int]]] = []

    def generate(contexts: list[list[int]], n: int, budgets: list[int]) -> list[list[tuple[list[int], float, str]]]:
        texts = [TOK.decode(c, skip_special_tokens=True) for c in contexts]
        calls.append((texts, n, budgets))
        out = []
        for text, budget in zip(texts, budgets, strict=True):
            group = []
            for reply in replies[text][:n]:
                ids = TOK.encode(reply, add_special_tokens=False) + ([] if reply.endswith("]") else [EOS])
                group.append((ids[:budget], -1.0 * len(ids[:budget]), finish if len(ids) <= budget else "length"))
            out.append(group)
        return out

    generate.calls = calls  # type: ignore[attr-defined]
    return generate


def episodes(task: MultiTurnTask, replies: dict[str, list[str]], n: int = 1, **kw: Any) -> list[Trajectory]:
    prompt = Prompt("12*34+5=", "12*34+5=", "413")
    ids = TOK.encode(prompt.text)
    budgets = {"max_new_tokens": 12, "max_episode_tokens": 48} | kw
    return run_episodes(scripted(replies), task, TOK, [prompt], [ids], n, **budgets)[0]


def test_a_tool_call_and_its_answer_make_one_trajectory_with_the_result_as_the_environments_span() -> None:
    task = make_task("calculator")
    right, wrong = episodes(task, {"12*34+5=": ["[12*34]", "412"], "12*34+5=[12*34]408;": ["413"]}, n=2)
    text = "[12*34]408;413"
    assert TOK.decode(right.token_ids, skip_special_tokens=True) == text and right.token_ids[-1] == EOS
    assert right.env_spans == [[7, 11]]  # "408;", written by the calculator
    assert TOK.decode(right.token_ids[7:11]) == "408;"
    assert (right.reward, right.turns, right.finish_reason, right.failure) == (1.0, 2, "stop", None)
    assert right.logprob_sum == -7.0 - 4.0  # the model's tokens only: "[12*34]", then "413" and EOS
    assert (wrong.reward, wrong.env_spans, wrong.turns) == (0.0, [], 1)  # answered at once, and wrongly
    assert task.reward(Prompt("12*34+5=", "12*34+5=", "413"), text) == 1.0


def test_every_live_episode_takes_its_turn_in_one_call() -> None:
    task = make_task("calculator")
    generate = scripted({"12*34+5=": ["[12*34]", "[12*34]", "7"], "12*34+5=[12*34]408;": ["413"]})
    prompt = Prompt("12*34+5=", "12*34+5=", "413")
    run_episodes(generate, task, TOK, [prompt], [TOK.encode(prompt.text)], 3, 12, 48)
    (first, n1, _), (second, n2, budgets) = generate.calls  # type: ignore[attr-defined]
    assert (n1, n2, len(second)) == (3, 1, 2) and budgets == [12, 12]  # two episodes went on, together


class Flaky(MultiTurnTask):
    """An environment that fails where it is told to, and records what it released."""

    max_turns = 3
    turn_stop = ("]",)

    def __init__(self, fail: str = "", forever: bool = False) -> None:
        self.fail, self.forever, self.finished = fail, forever, []

    def train_prompts(self, seed):  # pragma: no cover (not used)
        raise NotImplementedError

    def eval_prompts(self, n):  # pragma: no cover
        raise NotImplementedError

    def reward(self, prompt: Prompt, completion: str) -> float:
        return 0.5

    def start(self, prompt: Prompt) -> Any:
        if self.fail == "start":
            raise ConnectionError("environment server unreachable")
        return {"turns": 0}

    def step(self, prompt: Prompt, state: Any, turn: str) -> Step:
        state["turns"] += 1
        if self.fail == "step":
            raise TimeoutError("no answer within 5 s")
        return Step(observation="ok;", done=not self.forever and state["turns"] == 2)

    def finish(self, state: Any) -> None:
        self.finished.append(state)


@pytest.mark.parametrize("fail", ["start", "step"])
def test_an_environment_that_fails_ends_its_episode_with_the_reason(fail: str) -> None:
    task = Flaky(fail)
    (t,) = episodes(task, {"12*34+5=": ["[a]"]})
    assert t.finish_reason == "abort" and t.failure_kind == fail and t.reward is None
    assert ("unreachable" if fail == "start" else "no answer") in (t.failure or "")
    assert len(task.finished) == 1  # released however the episode ended


def test_turn_and_token_budgets_end_an_episode_as_length() -> None:
    script = {"12*34+5=": ["[a]"], "12*34+5=[a]ok;": ["[b]"], "12*34+5=[a]ok;[b]ok;": ["[c]"]}
    (t,) = episodes(Flaky(forever=True), script)
    assert (t.turns, t.finish_reason, t.reward) == (3, "length", None)  # max_turns, no end from the environment
    assert t.env_spans == [[3, 6], [9, 12]]  # the last turn's answer is not appended: nothing follows it
    (cut,) = episodes(Flaky(forever=True), {"12*34+5=": ["[a]"], "12*34+5=[a]ok;": ["[b]"]}, max_episode_tokens=8)
    assert (cut.turns, cut.finish_reason) == (2, "length") and len(cut.token_ids) <= 8


def test_a_generation_that_fails_ends_the_episode() -> None:
    prompt = Prompt("12*34+5=", "12*34+5=", "413")
    ((t,),) = run_episodes(
        scripted({"12*34+5=": ["[a]"]}, finish="abort"), Flaky(), TOK, [prompt], [TOK.encode(prompt.text)], 1, 12, 48
    )
    assert t.finish_reason == "abort" and t.failure_kind == "generation"


def test_the_calculator_parses_never_evaluates() -> None:
    assert calculate("37*45") == "1665;" and calculate("2*(3+4)") == "14;"
    assert calculate("__import__('os')") == "error;" and calculate("9**99") == "error;"
    assert tool_call("[37*45]") == "37*45" and tool_call("1673") is None and tool_call("x]") is None
    task = make_task("calculator")
    prompt = task.eval_prompts(1)[0]
    target = task.sft_target(prompt)
    assert target.startswith("[") and target.endswith(prompt.answer) and task.reward(prompt, target) == 1.0
    held = {p.prompt_id for p in task.eval_prompts(50)}
    train = task.train_prompts(seed=0)
    assert not held & {next(train).prompt_id for _ in range(2000)}
    assert not math.isnan(float(prompt.answer))
