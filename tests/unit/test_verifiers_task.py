"""verifiers tasksets as tasks (tba/tasks/verifiers.py), on the real package and a taskset of the tests'
own (tests/envs/vf_sums.py), loaded by name as verifiers loads any."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tba.tasks import make_task

ENVS = Path(__file__).resolve().parents[1] / "envs"


@pytest.fixture(autouse=True)
def envs_on_path(monkeypatch) -> None:
    monkeypatch.syspath_prepend(str(ENVS))


def test_a_taskset_by_name_gives_prompts_a_split_and_its_own_reward() -> None:
    task = make_task("verifiers", {"env": "vf-sums", "args": {"rows": 200}})
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


def test_bad_names_and_args_are_clear_errors() -> None:
    with pytest.raises(ValueError, match="'no-such-env' could not be loaded"):
        make_task("verifiers", {"env": "no-such-env"})
    with pytest.raises(ValueError, match="refused args"):
        make_task("verifiers", {"env": "vf-sums", "args": {"rows": "many"}})


def test_without_the_package_the_error_says_what_to_install(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "verifiers.v1", None)
    with pytest.raises(ValueError, match="pip install verifiers==0.4.0"):
        make_task("verifiers", {"env": "vf-sums"})
