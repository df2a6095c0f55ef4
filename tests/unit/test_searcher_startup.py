"""`tba searcher` refuses bad settings at once, with exit code 2 and the variable to fix."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tba.cli import main


def run(capsys: pytest.CaptureFixture, *argv: str) -> tuple[int, str]:
    code = main(["searcher", *argv])
    return code, capsys.readouterr().err


@pytest.fixture(scope="module")
def model_files(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Config and tokenizer of the tiny model with a stand-in weights file: loadable config, no engine."""
    from tba.model.tiny import init_model

    return init_model(tmp_path_factory.mktemp("m") / "tiny")


def test_missing_model_dir(capsys, tmp_path: Path) -> None:
    code, err = run(capsys, "--model", str(tmp_path / "nope"))
    assert code == 2
    assert "TBA_MODEL" in err and "does not exist" in err and "nope" in err


def test_model_dir_without_config(capsys, tmp_path: Path) -> None:
    code, err = run(capsys, "--model", str(tmp_path))
    assert code == 2 and "TBA_MODEL" in err and "no config.json" in err


def test_model_dir_with_broken_config(capsys, tmp_path: Path, model_files: Path) -> None:
    bad = tmp_path / "bad"
    shutil.copytree(model_files, bad)
    (bad / "config.json").write_text("{not json")
    code, err = run(capsys, "--model", str(bad))
    assert code == 2 and "TBA_MODEL" in err and "not valid JSON" in err


def test_model_dir_that_transformers_cannot_load(capsys, tmp_path: Path, model_files: Path) -> None:
    bad = tmp_path / "bad"
    shutil.copytree(model_files, bad)
    (bad / "config.json").write_text(json.dumps({"model_type": "no-such-architecture"}))
    code, err = run(capsys, "--model", str(bad))
    assert code == 2 and "TBA_MODEL" in err and "cannot load the model" in err


def test_model_dir_without_weights(capsys, tmp_path: Path, model_files: Path) -> None:
    bad = tmp_path / "bad"
    shutil.copytree(model_files, bad)
    for f in bad.glob("*.safetensors"):
        f.unlink()
    code, err = run(capsys, "--model", str(bad))
    assert code == 2 and "no weights" in err


def test_unknown_task(capsys, model_files: Path) -> None:
    code, err = run(capsys, "--model", str(model_files), "--task", "chess")
    assert code == 2 and "TBA_TASK" in err and "'chess'" in err and "arithmetic" in err


def test_bad_task_options(capsys, model_files: Path) -> None:
    code, err = run(capsys, "--model", str(model_files), "--task-options", '{"digits": 99}')
    assert code == 2 and "TBA_TASK_OPTIONS" in err and "digits" in err


def test_completion_longer_than_the_model(capsys, model_files: Path) -> None:
    code, err = run(capsys, "--model", str(model_files), "--max-new-tokens", "128", "--max-model-len", "128")
    assert code == 2 and "TBA_MAX_NEW_TOKENS" in err


def test_bad_setting_value(capsys) -> None:
    code, err = run(capsys, "--completions-per-prompt", "zero")
    assert code == 2 and "TBA_COMPLETIONS_PER_PROMPT" in err


def test_spill_dir_in_use(capsys, tmp_path: Path, model_files: Path) -> None:
    from services.searcher.spill import SpillQueue

    held = SpillQueue(tmp_path / "spill", max_bytes=1 << 20)
    try:
        code, err = run(
            capsys,
            "--model",
            str(model_files),
            "--spill-dir",
            str(tmp_path / "spill"),
            "--redis-url",
            "redis://127.0.0.1:1/0",
            "--metrics-port",
            "0",
        )
    finally:
        held.close()
    assert code == 2 and "TBA_SPILL_DIR" in err and "in use" in err


def test_a_task_none_of_whose_prompts_fits_is_refused(capsys, model_files: Path) -> None:
    """Otherwise the searcher would skip every prompt forever while reporting ready."""
    options = json.dumps({"digits": 6})  # "123456+654321=": 15 tokens of the tiny model, with its BOS
    code, err = run(
        capsys,
        "--model",
        str(model_files),
        "--task-options",
        options,
        "--max-model-len",
        "30",
        "--max-new-tokens",
        "16",
    )
    assert code == 2 and "TBA_MAX_MODEL_LEN" in err and "none of the first 64 prompts" in err, err
    assert "max_model_len 30 - the completion's 16 tokens leaves 14" in err


def test_prompts_that_fit_pass_the_length_check(model_files: Path) -> None:
    from services.searcher.startup import check_prompt_lengths
    from tba.model.tokenizer import load_tokenizer
    from tba.settings import SearcherSettings
    from tba.tasks import make_task

    settings = SearcherSettings(model=model_files, max_model_len=32, max_new_tokens=16)
    check_prompt_lengths(settings, make_task("arithmetic"), load_tokenizer(model_files))  # "37+45=": 7 tokens
