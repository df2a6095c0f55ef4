"""Tasks: exact rewards, the safe countdown parser, held-out sets disjoint from training."""

from __future__ import annotations

import itertools
import json
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tba.tasks import Prompt, expr, make_task, task_names
from tba.tasks.answers import last_number
from tba.tasks.countdown import parse_prompt
from tba.tasks.gsm8k import gold_number


def take(task, seed: int, n: int) -> list[Prompt]:
    return list(itertools.islice(task.train_prompts(seed), n))


# --- registry ---


def test_registry_has_every_task() -> None:
    assert task_names() == [
        "arithmetic",
        "calculator",
        "countdown",
        "gsm8k",
        "openenv",
        "reasoning-gym",
        "redteam",
        "reward-model",
        "sums",
        "verifiers",
    ]


def test_the_task_setting_names_every_registered_task() -> None:
    from tba.settings import CommonSettings

    description = CommonSettings.model_fields["task"].description or ""
    assert all(name in description for name in task_names()), description


CUSTOM_TASK = """
import itertools
from tba.tasks import Prompt, Task


class Echo(Task):
    \"\"\"Repeat the prompt's word: reward 1 for the exact word.\"\"\"

    def __init__(self, word: str = "tba") -> None:
        self.word = word

    def train_prompts(self, seed):
        return (Prompt(f"echo-{i}", f"say {self.word}:", self.word) for i in itertools.count())

    def eval_prompts(self, n):
        return [Prompt("echo-eval", f"say {self.word}:", self.word)][:n]

    def reward(self, prompt, completion):
        return float(completion.strip() == prompt.answer)


NotATask = dict
"""


def test_a_task_of_your_own_by_module_and_class(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "tba_custom_tasks.py").write_text(CUSTOM_TASK)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "tba_custom_tasks", raising=False)
    task = make_task("tba_custom_tasks:Echo", {"word": "hello"})
    (prompt,) = task.eval_prompts(5)
    assert task.rewards(prompt, ["hello", " hello ", "bye"]) == [1.0, 1.0, 0.0]
    with pytest.raises(ValueError, match="bad options for task 'tba_custom_tasks:Echo'.*colour"):
        make_task("tba_custom_tasks:Echo", {"colour": "red"})
    with pytest.raises(ValueError, match="'tba_custom_tasks:NotATask' is not a subclass of tba.tasks.Task"):
        make_task("tba_custom_tasks:NotATask")
    with pytest.raises(ValueError, match="cannot import Missing from tba_custom_tasks"):
        make_task("tba_custom_tasks:Missing")
    with pytest.raises(ValueError, match="cannot import Echo from no_such_module"):
        make_task("no_such_module:Echo")


def test_unknown_task_and_bad_options_are_named() -> None:
    with pytest.raises(ValueError, match="unknown task 'chess'.*arithmetic, calculator, countdown"):
        make_task("chess")
    with pytest.raises(ValueError, match="bad options for task 'arithmetic'.*colour"):
        make_task("arithmetic", {"colour": "red"})
    with pytest.raises(ValueError, match="digits must be between 1 and 6, got 9"):
        make_task("arithmetic", {"digits": 9})
    with pytest.raises(ValueError, match="held_out_fraction"):
        make_task("countdown", {"held_out_fraction": 0})


# --- arithmetic ---


def test_arithmetic_reward_is_exact() -> None:
    task = make_task("arithmetic")
    p = Prompt("37+45=", "37+45=", "82")
    assert task.reward(p, "82") == 1.0
    assert task.reward(p, " 82 ") == 1.0
    assert task.reward(p, "83") == 0.0
    assert task.reward(p, "82 ") == 1.0 and task.reward(p, "820") == 0.0 and task.reward(p, "") == 0.0
    assert task.answer_key(p, "82") == "82" and task.answer_key(p, "81") is None


def test_arithmetic_held_out_is_disjoint_and_stable() -> None:
    task = make_task("arithmetic", {"digits": 2})
    held = task.eval_prompts(500)
    assert len(held) == 500 and len({p.prompt_id for p in held}) == 500
    assert held == make_task("arithmetic").eval_prompts(500)
    assert held[:10] == task.eval_prompts(10)
    held_ids = {p.prompt_id for p in task.eval_prompts(10_000)}
    train = take(task, 0, 5000) + take(task, 1, 5000)
    assert not held_ids & {p.prompt_id for p in train}
    assert take(task, 0, 50) != take(task, 1, 50)  # replicas explore different prompts
    for p in held[:50] + train[:50]:
        a, b = p.text.rstrip("=").split("+")
        assert 10 <= int(a) <= 99 and 10 <= int(b) <= 99 and int(p.answer) == int(a) + int(b)
        assert task.reward(p, task.sft_target(p)) == 1.0


def test_arithmetic_eval_prompts_end_when_the_held_out_set_is_small() -> None:
    task = make_task("arithmetic", {"digits": 1})
    held = task.eval_prompts(1000)  # only about 10 of the 100 one-digit pairs are held out
    assert 0 < len(held) < 100 and len({p.prompt_id for p in held}) == len(held)
    big = make_task("arithmetic", {"digits": 4}).eval_prompts(20)
    assert len(big) == 20 and all(len(p.text) == 10 for p in big)


# --- countdown: the parser ---


@pytest.mark.parametrize(
    "text",
    [
        "__import__('os').system('true')",
        "x",
        "a.b",
        "(1).real",
        "2**99999",
        "9**9**9",
        "1/0",
        "7//2",
        "7%2",
        "1e5",
        "0x10",
        "1_000",
        "abs(3)",
        "3+",
        "+3",
        "-3",
        "()",
        "(3",
        "3)",
        "3 4",
        "",
        "   ",
        "٣+1",
        "3\n+4",
        "1" * 5,
        "(" * 9 + "1" + ")" * 9,
        "+".join(["1"] * 40),
        "[3]",
        "3;4",
        "lambda: 1",
    ],
)
def test_parser_rejects_everything_outside_the_grammar(text: str) -> None:
    with pytest.raises(expr.ExpressionError):
        expr.parse(text)


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet="0123456789+-*() x/.", max_size=80))
def test_parser_never_fails_otherwise(text: str) -> None:
    try:
        node = expr.parse(text)
    except expr.ExpressionError:
        return
    key = expr.canonical(node)
    assert expr.value(expr.parse(key)) == expr.value(node)  # the canonical form is an equal expression
    assert expr.canonical(expr.parse(key)) == key


def test_parser_values_and_precedence() -> None:
    assert expr.value(expr.parse("2+3*4")) == 14
    assert expr.value(expr.parse("(2+3)*4")) == 20
    assert expr.value(expr.parse("9-3-2")) == 4
    assert expr.value(expr.parse("9-(3-2)")) == 8
    assert expr.value(expr.parse(" ( ( 7 ) ) ")) == 7
    assert expr.value(expr.parse("(" * 8 + "1" + ")" * 8)) == 1
    assert sorted(expr.numbers(expr.parse("3*(3+4)-1")).elements()) == [1, 3, 3, 4]


def test_canonical_form_merges_reorderings_only() -> None:
    same = ["3+5*2", "5*2+3", "(2*5)+3", "3+(5*2)", "2*5+3"]
    assert len({expr.canonical(expr.parse(t)) for t in same}) == 1
    assert expr.canonical(expr.parse("8-(2-1)")) == expr.canonical(expr.parse("8+1-2"))
    assert expr.canonical(expr.parse("2*(3+4)")) != expr.canonical(expr.parse("2*3+2*4"))
    assert expr.canonical(expr.parse("6-2")) != expr.canonical(expr.parse("2-6"))


# --- countdown: the task ---


def test_countdown_reward() -> None:
    task = make_task("countdown")
    p = Prompt("24 from 2 3 4 6:", "24 from 2 3 4 6:", "24")
    for good in ["4*6", "6*4", "2*3*4", " 3*(2+6) ", "(6-3)*2*4", "4 * 6"]:
        assert task.reward(p, good) == 1.0, good
    for bad in ["4*6*1", "6*6-12", "2*2*6", "25", "24", "3*(2+6", "eval('24')", "4*6=24", "4*6+0", "4*6\n7"]:
        assert task.reward(p, bad) == 0.0, bad
    assert task.reward(p, "") == 0.0


def test_countdown_numbers_used_at_most_once() -> None:
    task = make_task("countdown")
    p = Prompt("16 from 1 3 4 8:", "16 from 1 3 4 8:", "16")
    assert task.reward(p, "4*4") == 0.0  # 4 is given once
    assert task.reward(p, "8*(3-1)") == 1.0
    assert task.reward(p, "8+8") == 0.0
    assert task.reward(p, "2*8") == 0.0  # 2 is not given


def test_countdown_answer_key_counts_distinct_answers() -> None:
    task = make_task("countdown")
    p = Prompt("24 from 2 3 4 6:", "24 from 2 3 4 6:", "24")
    keys = {task.answer_key(p, c) for c in ["4*6", "6*4", "(4*6)", "2*3*4", "4*3*2", "3*(2+6)", "(6+2)*3", "25"]}
    assert keys == {"4*6", "2*3*4", "(2+6)*3", None}


def test_countdown_prompts_are_solvable_short_and_diverse() -> None:
    task = make_task("countdown")
    held = task.eval_prompts(60)
    assert len(held) == 60 and held == make_task("countdown").eval_prompts(60)
    for p in held:
        target, given = parse_prompt(p.text)
        assert len(given) == 4 and all(1 <= g <= 9 for g in given) and 10 <= target <= 50
        assert target not in given and p.answer == str(target)
        found = expr.solutions(given, target)
        assert len(found) >= 3  # many distinct correct answers
        for key, text in found.items():
            assert task.answer_key(p, text) == key
        answer = task.sft_target(p)
        assert task.reward(p, answer) == 1.0 and len(answer) <= 12
        assert len(p.text) + len(answer) <= 30  # fits the tiny model's 128-token window many times over


def test_countdown_held_out_is_disjoint_by_number_set() -> None:
    task = make_task("countdown")
    held = task.eval_prompts(100)
    train = take(task, 0, 1000) + take(task, 7, 1000)
    assert not {p.prompt_id for p in held} & {p.prompt_id for p in train}
    assert not {p.text.split(" from ")[1] for p in held} & {p.text.split(" from ")[1] for p in train}


def test_countdown_options() -> None:
    small = make_task("countdown", {"count": 3, "max_number": 6, "min_target": 5, "max_target": 20})
    for p in small.eval_prompts(20) + take(small, 0, 20):
        target, given = parse_prompt(p.text)
        assert len(given) == 3 and max(given) <= 6 and 5 <= target <= 20
    with pytest.raises(ValueError, match="count must be between 2 and 5"):
        make_task("countdown", {"count": 7})
    with pytest.raises(ValueError, match="widen"):
        make_task("countdown", {"count": 2, "max_number": 2, "min_target": 90, "max_target": 99})


# --- gsm8k ---


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def gsm_rows(n: int, offset: int = 0) -> list[dict]:
    return [
        {
            "question": f"Tom has {i} apples and buys {i + 1} more. How many?",
            "answer": f"{i}+{i + 1}=<<{i}+{i + 1}={2 * i + 1}>>{2 * i + 1}\n#### {2 * i + 1:,}",
        }
        for i in range(offset, offset + n)
    ]


def test_last_number_rule() -> None:
    assert last_number("so 3 then 1,234.") == 1234
    assert last_number("-7 degrees") == -7 and last_number("2.50 dollars") == 2.5 and last_number("none") is None
    assert gold_number("48/2 = 24\n#### 72") == 72 and gold_number("it is 5") == 5
    assert gold_number("#### 1,000") == 1000


def test_gsm8k_reward(tmp_path: Path) -> None:
    task = make_task("gsm8k", {"path": str(write_jsonl(tmp_path / "train.jsonl", gsm_rows(40, 600)))})
    p = next(task.train_prompts(0))
    gold = int(p.answer.split("####")[1].replace(",", ""))
    assert p.text.startswith("Question: Tom has") and p.text.endswith("\nAnswer:")
    assert task.reward(p, f"The answer is {gold:,}.") == 1.0
    assert task.reward(p, f"{gold}.0") == 1.0
    assert task.reward(p, f"{gold} or maybe {gold + 1}") == 0.0  # the LAST number counts
    assert task.reward(p, "I do not know") == 0.0
    assert task.reward(p, task.sft_target(p)) == 1.0


def test_gsm8k_splits_are_disjoint(tmp_path: Path) -> None:
    train_file = write_jsonl(tmp_path / "train.jsonl", gsm_rows(300))
    task = make_task("gsm8k", {"path": str(train_file), "held_out_fraction": 0.2})
    held = {p.prompt_id for p in task.eval_prompts(1000)}
    train = take(task, 0, 600)
    assert 20 < len(held) < 100
    assert not held & {p.prompt_id for p in train}
    assert len({p.prompt_id for p in train}) == 300 - len(held)  # every training prompt, epoch after epoch
    eval_file = write_jsonl(tmp_path / "test.jsonl", gsm_rows(10, 295))  # overlaps 5 training questions
    task = make_task("gsm8k", {"path": str(train_file), "eval_path": str(eval_file)})
    held = {p.prompt_id for p in task.eval_prompts(100)}
    assert len(held) == 10 and not held & {p.prompt_id for p in take(task, 3, 1000)}


def test_gsm8k_bad_files_are_named(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="needs the option path"):
        make_task("gsm8k")
    with pytest.raises(ValueError, match="does not exist"):
        make_task("gsm8k", {"path": str(tmp_path / "missing.jsonl")})
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(gsm_rows(1)[0]) + "\n{oops\n")
    with pytest.raises(ValueError, match=r"bad.jsonl:2: not valid JSON"):
        make_task("gsm8k", {"path": str(bad)})
    write_jsonl(bad, [{"question": "q?"}])
    with pytest.raises(ValueError, match=r"bad.jsonl:1: field 'answer' is missing"):
        make_task("gsm8k", {"path": str(bad)})


# --- reward-model (scoring itself is tested with a real model in tests/integration) ---


def test_reward_model_options_checked_at_construction(tmp_path: Path) -> None:
    prompts = write_jsonl(tmp_path / "p.jsonl", [{"prompt": "Summarise: a b c\n"}])
    with pytest.raises(ValueError, match="needs the options model_dir"):
        make_task("reward-model", {"path": str(prompts)})
    with pytest.raises(ValueError, match="not a Hugging Face model directory"):
        make_task("reward-model", {"model_dir": str(tmp_path), "path": str(prompts)})


# --- chat form: prompts asked as user messages, answers read from chat replies ---


def test_arithmetic_chat_form() -> None:
    plain, chat = make_task("arithmetic"), make_task("arithmetic", chat=True)
    p, c = plain.eval_prompts(20), chat.eval_prompts(20)
    assert [x.prompt_id for x in p] == [x.prompt_id for x in c]  # same prompts, same held-out split
    assert c[0].text == f"What is {c[0].prompt_id.rstrip('=')}? Answer with the number only."
    assert c[0].answer == p[0].answer and take(chat, 0, 5)[0].prompt_id == take(plain, 0, 5)[0].prompt_id
    q = Prompt("37+45=", "What is 37+45? Answer with the number only.", "82")
    for reply, reward in [
        ("82", 1.0),
        ("37 + 45 = 82", 1.0),
        ("The answer is 82.", 1.0),
        ("82.0", 1.0),
        ("It is 82, not 81", 0.0),
        ("37 + 45 = 83", 0.0),
        ("I cannot say", 0.0),
        ("820", 0.0),
    ]:
        assert chat.reward(q, reply) == reward, reply
    assert plain.reward(q, "The answer is 82.") == 0.0  # the plain form stays exact


def test_countdown_chat_form() -> None:
    plain, chat = make_task("countdown"), make_task("countdown", chat=True)
    c = chat.eval_prompts(5)
    assert [x.prompt_id for x in c] == [x.prompt_id for x in plain.eval_prompts(5)]
    target, given = parse_prompt(c[0].prompt_id)
    assert c[0].text.startswith(f"Use some of the numbers {' '.join(map(str, given))}, each at most once")
    assert f"to make {target}." in c[0].text
    q = Prompt("24 from 2 3 4 6:", "Use some of the numbers 2 3 4 6 ... to make 24.", "24")
    for reply, reward in [
        ("4*6", 1.0),
        ("4*6 = 24", 1.0),
        ("We can write (6-3)*2*4.", 1.0),
        ("First 2+3, no. Answer: 3*(2+6)", 1.0),
        ("24", 0.0),
        ("4*7 = 28", 0.0),
        ("6*4*1", 0.0),
        ("", 0.0),
    ]:
        assert chat.reward(q, reply) == reward, reply
    assert chat.answer_key(q, "so 6*4 = 24") == chat.answer_key(q, "4*6")
    assert chat.reward(q, chat.sft_target(q)) == 1.0


def test_gsm8k_chat_form_asks_the_question_itself(tmp_path: Path) -> None:
    path = str(write_jsonl(tmp_path / "train.jsonl", gsm_rows(40, 600)))
    plain, chat = make_task("gsm8k", {"path": path}), make_task("gsm8k", {"path": path}, chat=True)
    p, c = next(plain.train_prompts(0)), next(chat.train_prompts(0))
    assert p.prompt_id == c.prompt_id and p.text == f"Question: {c.text}\nAnswer:"
    assert c.text.startswith("Tom has") and not c.text.endswith("Answer:")
    assert [x.prompt_id for x in chat.eval_prompts(5)] == [x.prompt_id for x in plain.eval_prompts(5)]
    gold = int(c.answer.split("####")[1].replace(",", ""))
    assert chat.reward(c, f"Tom ends with {gold} apples.") == 1.0


def test_sums_rewards_any_correct_pair_and_counts_unordered_pairs() -> None:
    task = make_task("sums")
    p = next(task.train_prompts(0))
    n = int(p.answer)
    assert p.text == f"{n}="
    assert task.reward(p, f"{n - 1}+1") == task.reward(p, f" 1 + {n - 1} ") == 1.0
    assert task.reward(p, f"0+{n}") == task.reward(p, f"{n}+1") == task.reward(p, str(n)) == 0.0
    assert task.reward(p, f"1+{n - 1}+0") == 0.0  # exactly two terms
    assert task.answer_key(p, f"{n - 1}+1") == task.answer_key(p, f"1+{n - 1}") == f"1+{n - 1}"
    assert task.answer_key(p, f"002+{n - 2}") == f"2+{n - 2}"  # leading zeros: the same pair


def test_sums_warm_up_targets_are_correct_varied_digit_wise_splits() -> None:
    task = make_task("sums")
    p = task._prompt(457)
    targets = {task.sft_target(p) for _ in range(200)}
    assert all(task.reward(p, t) == 1.0 and len(t) == 7 for t in targets)
    assert len(targets) > 100  # 5 * 6 * 8 = 240 splits, less the two with an empty side
    assert task.sft_target(task._prompt(100)) == "001+099"  # no digit-wise split: still a correct answer


def test_sums_held_out_is_disjoint_and_options_are_checked() -> None:
    task = make_task("sums")
    held = {q.prompt_id for q in task.eval_prompts(1000)}
    assert 50 < len(held) < 150  # about 10% of 900 targets
    assert not held & {q.prompt_id for q in itertools.islice(task.train_prompts(3), 2000)}
    with pytest.raises(ValueError, match="low=5, high=3"):
        make_task("sums", {"low": 5, "high": 3})
    chat = make_task("sums", chat=True)
    q = chat._prompt(457)
    assert "457" in q.text and chat.reward(q, "Sure: 400 + 57 = 457") == 1.0
    assert chat.reward(q, "400 + 57 is 457, or 450+8") == 0.0  # the last a+b counts
