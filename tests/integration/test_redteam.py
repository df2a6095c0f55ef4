"""The red-teaming task: a judge the project trains itself, rewards as its probabilities, successes recorded."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tba.model.classifier import Judge, ensure_classifier, labelled_strings
from tba.tasks import make_task


@pytest.fixture(scope="module")
def judge_dir(tmp_path_factory) -> Path:
    return ensure_classifier("77", cache_root=tmp_path_factory.mktemp("cache"), log=lambda _: None)


def test_the_judge_learns_the_property_and_is_cached(judge_dir: Path) -> None:
    assert json.loads((judge_dir / "judge.json").read_text())["held_out_accuracy"] >= 0.995
    assert ensure_classifier("77", cache_root=judge_dir.parent) == judge_dir  # the cached one, not trained again
    import random

    pairs = labelled_strings("77", 500, random.Random(7))
    scores = Judge(judge_dir).scores([t for t, _ in pairs])
    assert sum((s > 0.5) == bool(y) for s, (_, y) in zip(scores, pairs, strict=True)) >= 495
    with pytest.raises(ValueError, match="pattern must be 1 to 4 digits"):
        ensure_classifier("7a")


def test_rewards_are_the_judges_probabilities_and_successes_are_recorded(
    judge_dir: Path, tmp_path: Path, monkeypatch
) -> None:
    monkeypatch.setenv("TBA_SEARCHER_ID", "searcher-3")
    task = make_task("redteam", {"judge_dir": str(judge_dir), "successes_dir": str(tmp_path / "found")})
    prompt = next(task.train_prompts(0))
    rewards = task.rewards(prompt, ["177", "150", "77", "1 7 7"])
    assert [task.success(r) for r in rewards] == [True, False, True, False]
    assert all(0.0 <= r <= 1.0 for r in rewards)
    assert task.answer_key(prompt, " 177 ") == "177" and task.answer_key(prompt, "150") is None
    logs = list((tmp_path / "found").glob("successes-searcher-3-*.jsonl"))
    lines = [json.loads(line) for f in logs for line in f.read_text().splitlines()]
    assert [x["text"] for x in lines][:2] == ["177", "77"] and lines[0]["prompt"] == prompt.prompt_id
    assert task.eval_prompts(5) == make_task("arithmetic").eval_prompts(5)  # the arithmetic prompts
    with pytest.raises(ValueError, match="no judge.json"):
        make_task("redteam", {"judge_dir": str(tmp_path)})
    with pytest.raises(ValueError, match="threshold"):
        make_task("redteam", {"threshold": 1.5})
