"""A real benchmark part, at its smallest, writes a valid record: ``python -m benchmarks.run evaluate --records DIR``
with 8 prompts and one repeat measures ours and both baselines, and the record holds what it ran with."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import evaluate, run
from experiments import records, report

pytestmark = pytest.mark.slow  # loads torch and decodes 8 prompts three ways, twice: a few seconds


def test_the_evaluate_part_writes_a_record_the_pages_render(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(evaluate, "N_PROMPTS", 8)
    monkeypatch.setattr(evaluate, "ROUNDS", 1)
    data = tmp_path / "results" / "data"
    assert run.main(["evaluate", "--records", str(data)]) == 0
    (path,) = (data / "evaluate").glob("*.json")
    record = json.loads(path.read_text())

    assert path.stem == records.record_name("evaluate", None, record)
    assert record["schema"] == records.SCHEMA and record["machine"]["cores"] >= 1 and record["packages"]["torch"]
    assert record["settings"]["prompts"] == 8 and record["settings"]["repeats"] == 1  # what it ran with
    assert record["seconds"] > 0
    assert len(record["figures"]) == 2
    for figure in record["figures"]:
        assert figure["value"] > 0 and figure["baseline"] > 0 and figure["unit"] == "prompts/s"
        assert figure["ratio"] == pytest.approx(figure["value"] / figure["baseline"])
    page = report.build(data)[tmp_path / "results" / "evaluation-throughput.md"]
    assert path.stem in page and "greedy eval vs generate one prompt at a time" in page
