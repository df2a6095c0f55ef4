"""The raw model in each prompt form (experiments/prompt_forms.py): greedy accuracy and pass@k per form, with the
evaluation every run uses, recorded where the real-model page shows it; a bad option is named."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from experiments import report
from experiments.peer import task_label
from experiments.prompt_forms import main


def test_each_form_is_measured_and_recorded(tiny_model: Path, tmp_path: Path) -> None:
    results = tmp_path / "results"
    forms = "plain-first-line,plain-lenient"  # the tiny model has no chat template
    argv = ["--model", str(tiny_model), "--forms", forms, "--samples", "2", "--prompts", "4", "--threads", "1"]
    assert main([*argv, "--results", str(results)]) == 0
    (path,) = (results / "data" / "real-model").glob("prompt-forms-*.json")
    assert path.name.startswith("prompt-forms-aiw-")  # the profile's own task options: no digest
    record = json.loads(path.read_text())
    assert record["experiment"] == "prompt-forms" and record["prompts"] == 4 and record["samples"] == 2
    assert [f["form"] for f in record["forms"]] == ["plain-first-line", "plain-lenient"]
    for form in record["forms"]:
        assert not form["chat"] and form["stop"] == ["\n"] and form["prompts"] == 4
        assert 0.0 <= form["greedy"] <= 1.0 and set(form["pass_at_k"]) == {"1", "2"}
        assert form["pass_at_k"]["1"] <= form["pass_at_k"]["2"]
    assert [f["reader"] for f in record["forms"]] == ["tags", "lenient"]
    # The real-model page needs the experiment's own record; the forms alone make no page.
    assert results / "real-model.md" not in report.build(results / "data")


def test_a_bad_option_is_named(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    bad = [
        (["--forms", "chat-loud"], "no form ['chat-loud']"),
        (["--samples", "0"], "--samples"),
        (["--task-options", "{dataset: 1}"], "--task-options: not JSON"),
        (["--task-options", '["chain_sum"]'], "--task-options: not a JSON object"),
        (["--task-options", '{"dataset": "chain_summ"}'], "no dataset 'chain_summ'"),
    ]
    for argv, message in bad:
        with pytest.raises(SystemExit) as exit_info:
            main([*argv, "--results", str(tmp_path)])
        assert exit_info.value.code == 2 and message in capsys.readouterr().err
    assert not list(tmp_path.rglob("*.json"))  # nothing recorded


def test_screened_task_options_are_kept_apart_by_name() -> None:
    own = {"dataset": "chain_sum", "config": {"min_terms": 2}}
    assert task_label(own, own) == "chain-sum"
    three = task_label({"dataset": "chain_sum", "config": {"min_terms": 3}}, own)
    assert three.startswith("chain-sum-") and three != task_label({"dataset": "chain_sum"}, own)
    assert task_label({"config": {"min_terms": 3}, "dataset": "chain_sum"}, own) == three  # key order: same name
