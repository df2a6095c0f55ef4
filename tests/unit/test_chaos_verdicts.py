"""The chaos suite's verdicts from what it measured: a fault that left no trace in the log fails its
criterion with a reason, it does not end the run."""

from __future__ import annotations

from collections import Counter

from reliability.chaos import disk_full_verdict

FIGURES = {"failed_writes": 3, "steps_meanwhile": 12, "kept": 7, "published_again_after_s": 4.2}


def test_a_full_disk_survived() -> None:
    ok, outcome = disk_full_verdict(FIGURES, Counter({"File too large (os error 27)": 3}), kept_ok=True)
    assert ok and 'e.g. "File too large (os error 27)"' in outcome and "v7 stayed LATEST and verified" in outcome


def test_no_failed_write_in_the_log_fails_the_criterion_with_a_reason() -> None:
    ok, outcome = disk_full_verdict({**FIGURES, "failed_writes": 0}, Counter(), kept_ok=True)
    assert not ok and "logged 0 failed checkpoint writes (no reason found in its log)" in outcome


def test_a_kept_checkpoint_that_does_not_verify_fails() -> None:
    ok, outcome = disk_full_verdict(FIGURES, Counter({"x": 3}), kept_ok=False)
    assert not ok and "did NOT verify" in outcome
