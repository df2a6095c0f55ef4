"""Settings: environment variables TBA_*, matching CLI flags, and errors that name the variable."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from tba.settings import (
    BufferSettings,
    CommonSettings,
    SearcherSettings,
    SettingsError,
    TrainerSettings,
    add_settings_arguments,
    load_settings,
)


def parse(cls, argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_settings_arguments(parser, cls)
    return parser.parse_args(argv)


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    for name in list(os.environ):
        if name.startswith("TBA_"):
            monkeypatch.delenv(name)


def test_defaults() -> None:
    s = load_settings(TrainerSettings)
    assert s.redis_url.startswith("redis://") and s.task == "arithmetic" and s.temperature == 0.7
    assert s.max_steps is None


def test_env_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TBA_REDIS_URL", "redis://example:6380/2")
    monkeypatch.setenv("TBA_TASK", "countdown")
    monkeypatch.setenv("TBA_TASK_OPTIONS", '{"count": 3}')
    monkeypatch.setenv("TBA_CHECKPOINT_DIR", "/data/ckpt")
    monkeypatch.setenv("TBA_AUTH_TOKEN", "s3cret")
    monkeypatch.setenv("TBA_LR", "3e-5")
    s = load_settings(TrainerSettings)
    assert s.redis_url == "redis://example:6380/2"
    assert s.task == "countdown" and s.task_options == {"count": 3}
    assert s.checkpoint_dir == Path("/data/ckpt")
    assert s.auth_token is not None and s.auth_token.get_secret_value() == "s3cret"
    assert "s3cret" not in repr(s)
    assert s.lr == 3e-5


def test_cli_flags_override_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TBA_PER_PROMPT_CAPACITY", "50")
    monkeypatch.setenv("TBA_PORT", "9000")
    args = parse(BufferSettings, ["--per-prompt-capacity", "20", "--task-options", '{"digits": 3}'])
    s = load_settings(BufferSettings, args)
    assert s.per_prompt_capacity == 20  # flag beats env
    assert s.port == 9000  # env still applies where no flag is given
    assert s.task_options == {"digits": 3}


def test_keyword_overrides_win() -> None:
    args = parse(SearcherSettings, ["--samples-per-prompt", "4"])
    assert load_settings(SearcherSettings, args, samples_per_prompt=6).samples_per_prompt == 6


@pytest.mark.parametrize("env,value,cls", [
    ("TBA_REDIS_URL", "http://nope", CommonSettings),
    ("TBA_PORT", "70000", BufferSettings),
    ("TBA_TEMPERATURE", "0", TrainerSettings),
    ("TBA_LR", "fast", TrainerSettings),
    ("TBA_LOG_LEVEL", "LOUD", CommonSettings),
    ("TBA_NAMESPACE", "a b", CommonSettings),
    ("TBA_SAMPLES_PER_PROMPT", "1", TrainerSettings),
    ("TBA_TASK_OPTIONS", "{bad", CommonSettings),
    ("TBA_CHAT_TEMPLATE", "sometimes", SearcherSettings),
    ("TBA_STOP", "[\"\"]", SearcherSettings),
    ("TBA_STOP", "not json", SearcherSettings),
    ("TBA_MAX_NEW_TOKENS", "99999999", SearcherSettings),
])
def test_bad_env_value_names_the_variable(monkeypatch: pytest.MonkeyPatch, env: str, value: str, cls) -> None:
    monkeypatch.setenv(env, value)
    with pytest.raises(SettingsError) as exc:
        load_settings(cls)
    msg = str(exc.value)
    assert env in msg and "--" + env.removeprefix("TBA_").lower().replace("_", "-") in msg


def test_bad_flag_value_names_flag_and_value() -> None:
    with pytest.raises(SettingsError) as exc:
        load_settings(TrainerSettings, parse(TrainerSettings, ["--recency-prob", "1.5"]))
    assert "TBA_RECENCY_PROB / --recency-prob" in str(exc.value) and "1.5" in str(exc.value)
    with pytest.raises(SettingsError, match="--task-options: not valid JSON"):
        load_settings(TrainerSettings, parse(TrainerSettings, ["--task-options", "{x"]))


def test_prompt_form_and_stop_strings(monkeypatch: pytest.MonkeyPatch) -> None:
    s = load_settings(SearcherSettings)
    assert s.chat_template == "auto" and s.system_prompt is None and s.stop == []
    monkeypatch.setenv("TBA_STOP", '["\\n\\n", "###"]')
    monkeypatch.setenv("TBA_SYSTEM_PROMPT", "Answer briefly.")
    s = load_settings(SearcherSettings)
    assert s.stop == ["\n\n", "###"] and s.system_prompt == "Answer briefly."
    args = parse(SearcherSettings, ["--stop", '["END"]', "--chat-template", "off"])
    s = load_settings(SearcherSettings, args)
    assert s.stop == ["END"] and s.chat_template == "off"
    with pytest.raises(SettingsError, match="--stop: not valid JSON"):
        load_settings(SearcherSettings, parse(SearcherSettings, ["--stop", "END"]))


def test_every_field_has_a_flag_and_a_description() -> None:
    for cls in (BufferSettings, TrainerSettings, SearcherSettings):
        parser = argparse.ArgumentParser()
        add_settings_arguments(parser, cls)
        help_text = parser.format_help()
        for name, field in cls.model_fields.items():
            assert field.description, f"{cls.__name__}.{name} has no description"
            assert "--" + name.replace("_", "-") in help_text
            assert f"TBA_{name.upper()}" in help_text.replace("\n", "").replace(" ", "")
        assert "s3cret" not in help_text
