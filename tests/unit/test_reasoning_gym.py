"""reasoning-gym's generators as tasks (tba/tasks/reasoning_gym.py), on the real package."""

from __future__ import annotations

import sys

import pytest

from tba.tasks import Prompt, make_task

CHAIN = {"dataset": "chain_sum", "config": {"max_terms": 3, "max_digits": 2}}


def test_held_out_questions_never_reach_training_and_the_scorer_grades_answers() -> None:
    task = make_task("reasoning-gym", CHAIN)
    held = task.eval_prompts(50)
    assert len(held) == 50 and len({p.prompt_id for p in held}) == 50
    assert task.eval_prompts(50) == held  # a fixed seed: the same set every time, in every process
    stream = task.train_prompts(seed=0)
    train = [next(stream) for _ in range(3000)]
    assert not {p.prompt_id for p in held} & {p.prompt_id for p in train}
    assert next(make_task("reasoning-gym", CHAIN).train_prompts(seed=0)) == train[0]  # seeded
    p = held[0]
    assert p.text.startswith("State the final answer") and p.text.endswith("Answer: ")
    assert task.reward(p, f" {p.answer}") == 1.0 and task.success(1.0)
    assert task.reward(p, str(int(p.answer) + 1)) == 0.0 and task.reward(p, "") == 0.0
    assert task.sft_target(p) == p.answer


def test_chat_form_asks_for_answer_tags_and_reads_them() -> None:
    task = make_task("reasoning-gym", {"dataset": "gcd"}, chat=True)
    p = task.eval_prompts(3)[0]
    assert p.text.endswith("inside <answer></answer> tags.")
    assert task.reward(p, f"Both are odd... <answer>{p.answer}</answer>") == 1.0
    assert task.reward(p, p.answer) == 0.0  # no tags: no answer read
    assert task.sft_target(p) == f"<answer>{p.answer}</answer>"


def test_the_lenient_reader_takes_tags_else_the_last_number_else_the_last_line() -> None:
    task = make_task("reasoning-gym", CHAIN | {"reader": "lenient"}, chat=True)
    p = task.eval_prompts(3)[0]
    right, wrong = p.answer, str(int(p.answer) + 1)
    assert task.reward(p, f"<answer>{right}</answer>") == 1.0  # tags first
    assert task.reward(p, f"The sum is {wrong}, so <answer>{right}</answer>") == 1.0
    assert task.reward(p, f"<answer>{wrong}</answer> is not {right}") == 0.0  # tags win over a later number
    assert task.reward(p, f"The sum of the terms is {right}.") == 1.0  # a sentence: its last number
    assert task.reward(p, f"{right}.0") == 1.0
    assert task.reward(p, f"{right}, or maybe {wrong}") == 0.0
    assert task.reward(p, "I cannot tell.") == 0.0 and task.reward(p, "") == 0.0  # no answer at all
    assert task.reward(p, "<answer></answer>") == 0.0
    assert task.reward(p, "blah " * 5000 + right) == 1.0  # a very long completion is read to its end
    words = make_task("reasoning-gym", {"dataset": "spell_backward", "reader": "lenient"}, chat=True)
    w = words.eval_prompts(2)[0]
    assert words.reward(w, f"Sure! Here it is:\n{w.answer}\n") == 1.0  # not a number: the last line
    assert words.reward(w, f"{w.answer}\nHope this helps!") == 0.0
    with pytest.raises(ValueError, match="reader must be one of tags, lenient"):
        make_task("reasoning-gym", CHAIN | {"reader": "loose"})


def test_bad_names_and_options_are_clear_errors() -> None:
    with pytest.raises(ValueError, match="no dataset 'chain_summ'"):
        make_task("reasoning-gym", {"dataset": "chain_summ"})
    with pytest.raises(ValueError, match="refused config .*bogus"):
        make_task("reasoning-gym", {"dataset": "chain_sum", "config": {"bogus": 1}})
    with pytest.raises(ValueError, match="bad options for task 'reasoning-gym'"):
        make_task("reasoning-gym", {"datset": "chain_sum"})
    task = make_task("reasoning-gym", CHAIN)
    with pytest.raises(KeyError, match="not drawn by this task"):
        task.reward(Prompt("chain_sum/unknown", "1 + 1 =", "2"), "2")


def test_an_enum_option_is_named_by_its_value() -> None:
    """aiw takes its task types as an enum: JSON names them by value, and a value it lacks is an error listing
    the ones it has."""
    options = {"task_types": ["siblings"], "task_type_weights": [1.0]}
    task = make_task("reasoning-gym", {"dataset": "aiw", "config": options, "reader": "lenient"})
    held = task.eval_prompts(20)
    assert len(held) == 20 and all("sisters" in p.text or "brothers" in p.text for p in held)
    assert all("colleagues" not in p.text and "friends" not in p.text for p in held)
    p = held[0]
    assert task.reward(p, f"The answer is {p.answer}.") == 1.0 and task.reward(p, "none") == 0.0
    with pytest.raises(ValueError, match="'task_types' takes 'siblings', 'friends', 'colleagues', got"):
        make_task("reasoning-gym", {"dataset": "aiw", "config": {"task_types": ["cousins"]}})


def test_without_the_package_the_error_says_what_to_install(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "reasoning_gym", None)  # import reasoning_gym raises ImportError
    with pytest.raises(ValueError, match="pip install reasoning-gym==0.1.25"):
        make_task("reasoning-gym", CHAIN)
