"""What ``python -m benchmarks.run`` writes is a record the results pages render: each part's figures with their
baselines and ratios, the settings it ran with and the provenance of experiments/records.py, where ``--records``
says (the parts' measurements are faked here; tests/integration/test_bench_record_files.py measures one for real)."""

from __future__ import annotations

import importlib
import json
from pathlib import Path

import pytest

from benchmarks import Figure, run
from experiments import records, report

FIGURES = [
    Figure("eval", "greedy eval vs transformers generate (batched)", 120.0, "prompts/s", 100.0, "about 1"),
    Figure("eval", "greedy eval vs generate one prompt at a time", 120.0, "prompts/s", None),
]


def test_every_part_says_what_it_runs_with() -> None:
    for part in run.PARTS:
        module = importlib.import_module(f"benchmarks.{part}")
        for model, quick in ((None, False), (Path("model"), False), (Path("model"), True)):
            settings = module.settings(model, quick)
            assert settings and json.loads(json.dumps(settings)) == settings, part


def test_a_part_writes_its_record_where_told_and_its_page_renders_it(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr("benchmarks.evaluate.main", lambda: list(FIGURES))
    data = tmp_path / "results" / "data"
    assert run.main(["evaluate", "--records", str(data)]) == 0
    (path,) = (data / "evaluate").glob("*.json")
    record = json.loads(path.read_text())

    assert record["schema"] == records.SCHEMA and record["benchmark"] == "evaluate"
    assert record["command"] == "python -m benchmarks.run evaluate" and record["quick"] is False
    assert {"date", "commit", "dirty", "recorded_in", "machine", "packages"} <= set(record)
    assert record["machine"]["cpu_model"] and record["packages"]["python"]
    assert record["settings"]["prompts"] == 200 and len(record["load_average"]) == 2
    first, second = record["figures"]
    assert first["value"] == 120.0 and first["baseline"] == 100.0 and first["ratio"] == pytest.approx(1.2)
    assert second["baseline"] is None and second["ratio"] is None
    assert path.stem == records.record_name("evaluate", None, record)  # what it measures, its code, its CPU

    page = report.build(data)[tmp_path / "results" / "evaluation-throughput.md"]
    assert "| greedy eval vs transformers generate (batched) | 120 prompts/s | 100 prompts/s | 1.20 | about 1 |" in page
    assert f"data/evaluate/{path.stem}.json" in page and "Reproduce: `python -m benchmarks.run evaluate`" in page


def test_a_model_run_names_its_record_by_the_model_and_a_quick_one_as_a_smoke_run(tmp_path: Path, monkeypatch) -> None:
    model = tmp_path / "smollm2-135m-instruct"
    model.mkdir()
    (model / "config.json").write_text("{}")
    monkeypatch.setattr("tba.model.importer.resolve_model", lambda value: model)
    monkeypatch.setattr("benchmarks.lora.main", lambda model, quick: [Figure("lora", "size", 1.0, "MB", 10.0)])
    data = tmp_path / "results" / "data"
    assert run.main(["--model", "smollm2-135m-instruct", "--quick", "lora", "--records", str(data)]) == 0
    (path,) = (data / "lora").glob("*.json")
    record = json.loads(path.read_text())
    assert path.stem.startswith("lora-smollm2-135m-instruct-") and path.stem.endswith("-quick")
    assert record["model"] == "smollm2-135m-instruct" and record["quick"] is True
    assert record["settings"]["repeats"] == 1
    assert record["command"] == "python -m benchmarks.run --model smollm2-135m-instruct --quick lora"
    page = report.build(data)[tmp_path / "results" / "lora-fsdp.md"]
    assert "## Smoke runs (`--quick`)" in page and "| size | 1 MB | 10 MB | 0.10 |  |" in page


def test_a_part_that_fails_writes_no_record(tmp_path: Path, monkeypatch) -> None:
    def broken():
        raise RuntimeError("no engine")

    monkeypatch.setattr("benchmarks.evaluate.main", broken)
    assert run.main(["evaluate", "--records", str(tmp_path)]) == 1
    assert not list(tmp_path.rglob("*.json"))
