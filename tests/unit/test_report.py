"""Pure parts of the run report: reading metrics files that a kill may have cut, time to a target."""

from __future__ import annotations

from pathlib import Path

from tba.report import read_jsonl, time_to_accuracy


def test_read_jsonl_skips_a_cut_last_line(tmp_path: Path) -> None:
    p = tmp_path / "m.jsonl"
    p.write_text('{"step": 1}\n{"step": 2}\n{"ste')
    assert read_jsonl(p) == [{"step": 1}, {"step": 2}]
    assert read_jsonl(tmp_path / "missing.jsonl") == []


def test_time_to_accuracy_is_the_first_crossing() -> None:
    evals = [{"t": 0, "accuracy": 0.2}, {"t": 30, "accuracy": 0.55},
             {"t": 60, "accuracy": 0.5}, {"t": 90, "accuracy": 0.8}]
    assert time_to_accuracy(evals, 0.5) == 30
    assert time_to_accuracy(evals, 0.8) == 90
    assert time_to_accuracy(evals, 0.9) is None
