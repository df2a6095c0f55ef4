"""``tba up`` refuses a bad flag or variable before it starts anything, naming what to fix, with the bounds the
settings classes give (one configuration system, not a second one in the launcher)."""

from __future__ import annotations

import argparse

import pytest

from tba.local.up import UsageError, add_arguments, check_args
from tba.settings import SettingsError


def parse(monkeypatch: pytest.MonkeyPatch, argv: list[str], env: dict[str, str] | None = None) -> argparse.Namespace:
    for name, value in (env or {}).items():
        monkeypatch.setenv(name, value)
    parser = argparse.ArgumentParser()
    add_arguments(parser)  # the flags' defaults read the environment when the parser is built
    return parser.parse_args(argv)


@pytest.mark.parametrize(
    ("argv", "env", "error", "says"),
    [
        (["--searchers", "0"], {}, UsageError, "--searchers must be at least 1, got 0"),
        ([], {"TBA_WANDB": "sometimes"}, UsageError, "TBA_WANDB must be off, offline or online, got 'sometimes'"),
        (["--task", "chess"], {}, UsageError, "--task: unknown task 'chess'"),
        ([], {"TBA_TASK_OPTIONS": '{"digits": 9}'}, UsageError, "digits must be between 1 and 6, got 9"),
        (["--trainer-procs", "0"], {}, SettingsError, "TBA_TRAINER_PROCS"),
        ([], {"TBA_TRAINER_PROCS": "many"}, SettingsError, "TBA_TRAINER_PROCS"),
        (["--trainer-procs", "2000"], {}, SettingsError, "TBA_TRAINER_PROCS"),
        (["--searcher-cpus", "0-x"], {}, UsageError, "--searcher-cpus"),
        (["--base-model", "/no/such/model"], {}, UsageError, "--base-model"),
        ([], {"TBA_TEMPERATURE": "hot"}, SettingsError, "TBA_TEMPERATURE"),
    ],
)
def test_a_bad_value_is_named(monkeypatch, argv, env, error, says) -> None:
    args = parse(monkeypatch, argv, env)
    with pytest.raises(error, match=None) as caught:
        check_args(args)
    assert says in str(caught.value), str(caught.value)


def test_a_schedule_that_decays_over_the_runs_budget_is_accepted(monkeypatch) -> None:
    """The trainer's settings are checked as tba up starts the trainer: with the run's budget as its limit."""
    check_args(parse(monkeypatch, ["--minutes", "3"], {"TBA_LR_SCHEDULE": "linear"}))


def test_good_values_resolve(monkeypatch) -> None:
    args = parse(monkeypatch, ["--trainer-procs", "2", "--searcher-cpus", "0"], {"TBA_TASK_OPTIONS": '{"digits": 3}'})
    check_args(args)
    assert args.trainer_procs == 2 and args.searcher_cpus == [0] and args.trainer_cpus is None
    assert args.searcher_settings.task_options == {"digits": 3}
