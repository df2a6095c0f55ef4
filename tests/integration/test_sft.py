"""The SFT warm-up: the cached base model lands in the weak-but-not-zero band, the cache is keyed,
atomic and shared by concurrent callers, and only completion tokens are trained on."""

from __future__ import annotations

import threading
from dataclasses import replace
from pathlib import Path

import pytest

from tba.cli import main as tba_main
from tba.model.evaluation import greedy_accuracy, load_model
from tba.model.sft import (
    RESULT_FILE,
    SFTConfig,
    _batch,
    cache_key,
    ensure_base_model,
    read_result,
    train_sft,
)
from tba.model.threads import torch_threads
from tba.model.tiny import TinyModelSpec
from tba.tasks import make_task

# A build small enough for a test: one tiny layer, a few steps, a target it cannot reach.
QUICK = SFTConfig(max_steps=3, eval_every=1, eval_prompts=8, target_accuracy=1.0)
SMALL = TinyModelSpec(hidden_size=64, num_layers=1, num_heads=1, intermediate_size=128)


@pytest.mark.slow
def test_base_model_is_weak_but_not_zero(sft_model: Path) -> None:
    record = read_result(sft_model)
    assert record["task"] == "arithmetic"
    assert 0.15 <= record["result"]["accuracy"] <= 0.60
    model, tok = load_model(sft_model)
    task = make_task("arithmetic")
    with torch_threads():
        measured = greedy_accuracy(model, tok, task, task.eval_prompts(record["config"]["eval_prompts"]))
    assert 0.15 <= measured <= 0.60
    assert abs(measured - record["result"]["accuracy"]) <= 0.02  # what was recorded is what was saved


@pytest.mark.slow
def test_second_call_hits_the_cache(sft_model: Path) -> None:
    before = (sft_model / "model.safetensors").stat().st_mtime_ns
    messages: list[str] = []
    assert ensure_base_model(log=messages.append) == sft_model
    assert messages == []  # nothing was built, nothing was even logged
    assert (sft_model / "model.safetensors").stat().st_mtime_ns == before


def test_cache_key_covers_what_determines_the_model() -> None:
    base = dict(task="arithmetic", options={"digits": 2}, spec=TinyModelSpec(), seed=0, config=SFTConfig())
    key = cache_key(**base)
    assert key == cache_key(**base)
    for change in [
        {"task": "countdown"},
        {"options": {"digits": 3}},
        {"seed": 1},
        {"spec": replace(TinyModelSpec(), num_layers=2)},
        {"config": replace(SFTConfig(), lr=2e-3)},
        {"config": replace(SFTConfig(), target_accuracy=0.4)},
    ]:
        assert cache_key(**{**base, **change}) != key, change


def test_only_completion_tokens_and_eos_are_labelled() -> None:
    input_ids, attention_mask, labels = _batch([([1, 7, 8], [9, 2]), ([1, 5], [6, 6, 6, 2])], pad_id=0)
    assert input_ids.tolist() == [[1, 7, 8, 9, 2, 0], [1, 5, 6, 6, 6, 2]]
    assert attention_mask.tolist() == [[1, 1, 1, 1, 1, 0], [1, 1, 1, 1, 1, 1]]
    assert labels.tolist() == [[-100, -100, -100, 9, 2, -100], [-100, -100, 6, 6, 6, 2]]


def test_concurrent_callers_share_one_atomic_build(tmp_path: Path) -> None:
    root = tmp_path / "cache"
    key = cache_key("arithmetic", {}, SMALL, 0, QUICK)
    stale = root / f".tmp-arithmetic-{key}-deadbeef"  # left by a builder that crashed
    stale.mkdir(parents=True)
    logs: list[list[str]] = [[], []]
    paths: list[Path | None] = [None, None]

    def call(i: int) -> None:
        paths[i] = ensure_base_model(root, spec=SMALL, config=QUICK, log=logs[i].append, threads=1)

    threads = [threading.Thread(target=call, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)
    assert paths[0] == paths[1] == root / f"arithmetic-{key}"
    assert sum(any("building" in m for m in log) for log in logs) == 1  # the other caller waited, then reused
    assert sorted(p.name for p in root.iterdir() if not p.name.startswith(".lock")) == [paths[0].name]
    record = read_result(paths[0])
    assert record["result"]["steps"] == 3 and not record["result"]["reached_target"]
    model, _ = load_model(paths[0])
    assert model.config.hidden_size == 64


def test_cli_sft_from_a_base_into_a_new_directory(
    tiny_model: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    out = tmp_path / "sft"
    argv = [
        "model",
        "sft",
        "--base",
        str(tiny_model),
        "--out",
        str(out),
        "--max-steps",
        "2",
        "--eval-every",
        "1",
        "--eval-prompts",
        "8",
        "--batch-size",
        "8",
        "--threads",
        "1",
    ]
    assert tba_main(argv) == 0
    printed = capsys.readouterr().out
    assert "sft: final held-out greedy accuracy" in printed and str(out) in printed
    assert (out / RESULT_FILE).is_file() and (out / "tokenizer.json").is_file()
    assert read_result(out)["result"]["steps"] == 2
    assert tba_main(argv) == 2  # never overwrites
    assert "already exists" in capsys.readouterr().err
    with pytest.raises(FileExistsError):
        train_sft(tiny_model, out, make_task("arithmetic"), QUICK)


def test_thread_count_is_set_for_the_block_and_restored() -> None:
    import os

    import torch

    from tba.model.threads import auto_threads

    before = torch.get_num_threads()
    assert 1 <= auto_threads() <= (os.cpu_count() or 1)
    with torch_threads(1) as n:
        assert n == 1 and torch.get_num_threads() == 1
    assert torch.get_num_threads() == before


def test_cli_sft_from_a_fresh_model(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "fresh"
    assert (
        tba_main(
            [
                "model",
                "sft",
                "--out",
                str(out),
                "--max-steps",
                "1",
                "--eval-prompts",
                "4",
                "--batch-size",
                "4",
                "--threads",
                "1",
                "--task",
                "countdown",
            ]
        )
        == 0
    )
    assert read_result(out)["task"] == "countdown" and read_result(out)["result"]["steps"] == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fresh"]  # the init directory is gone
    assert "model: " + str(out) in capsys.readouterr().out
