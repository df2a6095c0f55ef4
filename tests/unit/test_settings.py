"""Settings: environment variables TBA_*, matching CLI flags, and errors that name the variable."""

from __future__ import annotations

import argparse
import json
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
    redact_url,
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


def test_each_modes_learning_rate_is_a_setting_of_its_own() -> None:
    assert TrainerSettings().lr is None and TrainerSettings().peak_lr == TrainerSettings().lr_async == 2e-5
    assert TrainerSettings(mode="sync").peak_lr == TrainerSettings().lr_sync == 6e-5
    assert TrainerSettings(mode="sync", lr_sync=4e-5).peak_lr == 4e-5
    assert TrainerSettings(mode="sync", lr=1e-4).peak_lr == TrainerSettings(lr=1e-4).peak_lr == 1e-4  # both modes


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
    assert s.lr == s.peak_lr == 3e-5


def test_cli_flags_override_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TBA_PER_PROMPT_CAPACITY", "50")
    monkeypatch.setenv("TBA_PORT", "9000")
    args = parse(BufferSettings, ["--per-prompt-capacity", "20", "--task-options", '{"digits": 3}'])
    s = load_settings(BufferSettings, args)
    assert s.per_prompt_capacity == 20  # flag beats env
    assert s.port == 9000  # env still applies where no flag is given
    assert s.task_options == {"digits": 3}


def test_keyword_overrides_win() -> None:
    args = parse(SearcherSettings, ["--completions-per-prompt", "4"])
    assert load_settings(SearcherSettings, args, completions_per_prompt=6).completions_per_prompt == 6


@pytest.mark.parametrize(
    "env,value,cls",
    [
        ("TBA_REDIS_URL", "http://nope", CommonSettings),
        ("TBA_PORT", "70000", BufferSettings),
        ("TBA_TEMPERATURE", "0", TrainerSettings),
        ("TBA_LR", "fast", TrainerSettings),
        ("TBA_LOG_LEVEL", "LOUD", CommonSettings),
        ("TBA_NAMESPACE", "a b", CommonSettings),
        ("TBA_TRAIN_SAMPLES_PER_PROMPT", "1", TrainerSettings),
        ("TBA_COMPLETIONS_PER_PROMPT", "0", SearcherSettings),
        ("TBA_TASK_OPTIONS", "{bad", CommonSettings),
        ("TBA_CHAT_TEMPLATE", "sometimes", SearcherSettings),
        ("TBA_STOP", '[""]', SearcherSettings),
        ("TBA_STOP", "not json", SearcherSettings),
        ("TBA_MAX_NEW_TOKENS", "99999999", SearcherSettings),
        ("TBA_MAX_REUSE", "0", TrainerSettings),
        ("TBA_MAX_REUSE", "never", TrainerSettings),
        ("TBA_MAX_STALENESS", "-1", TrainerSettings),
        ("TBA_MAX_STALENESS", "2.5", TrainerSettings),
        ("TBA_SAMPLE_WAIT_SECONDS", "61", TrainerSettings),
        ("TBA_IMPORTANCE_CLIP", "1", TrainerSettings),
        ("TBA_IMPORTANCE_CLIP", "0", TrainerSettings),
    ],
)
def test_bad_env_value_names_the_variable(monkeypatch: pytest.MonkeyPatch, env: str, value: str, cls) -> None:
    monkeypatch.setenv(env, value)
    with pytest.raises(SettingsError) as exc:
        load_settings(cls)
    msg = str(exc.value)
    assert env in msg and "--" + env.removeprefix("TBA_").lower().replace("_", "-") in msg


def test_the_bounds_of_bounded_asynchrony_are_on_by_default_and_switched_off_by_name(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    s = load_settings(TrainerSettings)
    assert s.max_staleness is not None and s.max_reuse is not None
    monkeypatch.setenv("TBA_MAX_STALENESS", "off")
    s = load_settings(TrainerSettings, parse(TrainerSettings, ["--max-reuse", "None"]))
    assert s.max_staleness is None and s.max_reuse is None
    monkeypatch.setenv("TBA_MAX_STALENESS", "3")
    s = load_settings(TrainerSettings, parse(TrainerSettings, ["--max-reuse", "2.5"]))
    assert (s.max_staleness, s.max_reuse) == (3, 2.5)


def test_importance_weights_are_off_by_default_and_for_the_tb_loss_only(monkeypatch: pytest.MonkeyPatch) -> None:
    assert load_settings(TrainerSettings).importance_clip is None
    monkeypatch.setenv("TBA_IMPORTANCE_CLIP", "0.2")
    assert load_settings(TrainerSettings).importance_clip == 0.2
    assert load_settings(TrainerSettings, parse(TrainerSettings, ["--importance-clip", "0.1"])).importance_clip == 0.1
    monkeypatch.setenv("TBA_LOSS", "grpo")
    with pytest.raises(SettingsError, match="TBA_LOSS=grpo takes no importance weights"):
        load_settings(TrainerSettings)


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


# --- what a service writes of its settings: TBA_SETTINGS_FILE ---


def test_the_services_commands_write_the_settings_they_resolved(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Through `tba trainer` itself: every default resolved, the secret left out, the file whole."""
    import signal

    import services.trainer.loop
    from tba.cli import main

    monkeypatch.setattr(signal, "signal", lambda *_: None)
    monkeypatch.setattr(services.trainer.loop, "run_trainer", lambda settings, _stop: 0)
    out = tmp_path / "config" / "trainer.json"
    monkeypatch.setenv("TBA_SETTINGS_FILE", str(out))
    monkeypatch.setenv("TBA_AUTH_TOKEN", "s3cret")
    monkeypatch.setenv("TBA_MODE", "sync")
    assert main(["trainer", "--prompts-per-step", "4"]) == 0
    written = json.loads(out.read_text())
    assert written["service"] == "trainer"
    settings = written["settings"]
    assert settings["prompts_per_step"] == 4 and settings["mode"] == "sync"
    assert settings["lr"] is None and settings["lr_sync"] == 6e-5  # the peak rate it runs at is explicit
    assert "auth_token" not in settings and "s3cret" not in out.read_text()
    assert [p.name for p in out.parent.iterdir()] == ["trainer.json"]  # no temporary file left
    TrainerSettings(settings_file=None).write_resolved("trainer")  # unset: nothing written, nothing fails


def test_a_removed_name_is_simply_not_a_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TBA_SAMPLES_PER_PROMPT", "4")
    assert load_settings(TrainerSettings).train_samples_per_prompt == 8
    with pytest.raises(SystemExit):
        parse(TrainerSettings, ["--samples-per-prompt", "4"])


def test_urls_lose_their_password_wherever_they_are_shown() -> None:
    assert redact_url("redis://:pw@host:6379/0") == "redis://***@host:6379/0"
    assert redact_url("rediss://user:p@ss@host:6380") == "rediss://***@host:6380"
    assert redact_url("https://user:tok@buffer:8400/x?y=1") == "https://***@buffer:8400/x?y=1"
    assert redact_url("redis://host:6379/0") == "redis://host:6379/0"


def test_the_public_dump_carries_no_secret() -> None:
    """What the trainer writes into every checkpoint and its trackers: the settings without the token or the
    Redis password, everything else kept."""
    s = TrainerSettings(
        redis_url="redis://:hunter2-pw@redis:6379/0", auth_token="tok-s3cret", buffer_url="http://u:bpw@buffer:8400"
    )
    dumped = s.public_dump()
    text = json.dumps(dumped)
    for secret in ("hunter2-pw", "tok-s3cret", "bpw"):
        assert secret not in text
    assert "auth_token" not in dumped
    assert dumped["redis_url"] == "redis://***@redis:6379/0" and dumped["buffer_url"] == "http://***@buffer:8400"
    assert dumped["lr"] == s.lr and set(dumped) == set(TrainerSettings.model_fields) - {"auth_token"}
