"""``tba up`` refuses a bad flag or variable before it starts anything, naming what to fix, with the bounds the
settings classes give (one configuration system, not a second one in the launcher)."""

from __future__ import annotations

import argparse

import pytest

from tba.local.checks import UsageError, check_args
from tba.local.placement import config_layers, service_defaults, split_cpus
from tba.local.up import add_arguments, main
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
        (["--eval-every", "0"], {}, UsageError, "--eval-every must be in [0.5, 86400] seconds, got 0"),
        (["--eval-every", "nan"], {}, UsageError, "--eval-every must be in [0.5, 86400] seconds, got nan"),
        (["--eval-prompts", "0"], {}, UsageError, "--eval-prompts must be at least 1, got 0"),
        ([], {"TBA_PLACEMENT": "apart"}, UsageError, "TBA_PLACEMENT must be split or shared, got 'apart'"),
        (["--backfill", "9"], {}, UsageError, "--backfill must be in [0, 8], got 9"),
        (["--backfill", "1", "--placement", "shared"], {}, UsageError, "--backfill puts searchers on the trainer's"),
        ([], {"TBA_WANDB": "sometimes"}, UsageError, "TBA_WANDB must be off, offline or online, got 'sometimes'"),
        (["--task", "chess"], {}, UsageError, "--task: unknown task 'chess'"),
        ([], {"TBA_TASK_OPTIONS": '{"digits": 9}'}, UsageError, "digits must be between 1 and 6, got 9"),
        (["--trainer-procs", "0"], {}, SettingsError, "TBA_TRAINER_PROCS"),
        ([], {"TBA_TRAINER_PROCS": "many"}, SettingsError, "TBA_TRAINER_PROCS"),
        (["--trainer-procs", "2000"], {}, SettingsError, "TBA_TRAINER_PROCS"),
        (["--searcher-cpus", "0-x"], {}, UsageError, "--searcher-cpus"),
        (["--base-model", "/no/such/model"], {}, UsageError, "--base-model"),
        ([], {"TBA_TEMPERATURE": "hot"}, SettingsError, "TBA_TEMPERATURE"),
        ([], {"TBA_MAX_SAMPLES_AHEAD": "63"}, UsageError, "TBA_MAX_SAMPLES_AHEAD=63 is below the 64 samples"),
        ([], {"TBA_MAX_SAMPLES_AHEAD": "0"}, SettingsError, "TBA_MAX_SAMPLES_AHEAD"),
        (["--mode", "sync"], {"TBA_MAX_SAMPLES_AHEAD": "64"}, UsageError, "TBA_MAX_SAMPLES_AHEAD=64 with --mode sync"),
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
    sharded = parse(monkeypatch, ["--trainer-procs", "2", "--searcher-cpus", "0", "--trainer-cpus", "1"])
    check_args(sharded)
    assert "TBA_REF_PASS" not in service_defaults(sharded, "all"), "FSDP ranks: the reference pass stays searched"


def test_split_gives_the_trainer_the_last_half() -> None:
    assert split_cpus([0, 1]) == ([0], [1])
    assert split_cpus([0, 1, 2]) == ([0, 1], [2])
    assert split_cpus([2, 3, 4, 5]) == ([2, 3], [4, 5])
    assert split_cpus([0]) == (None, None), "one CPU: nothing to split"


@pytest.mark.parametrize(
    ("allowed", "argv", "env", "searcher_cpus", "trainer_cpus", "searchers", "backfill"),
    [
        # The default: search and training on cores of their own, one searcher per core of search (at most 2),
        # and one more on the trainer's cores at the lowest priority (asynchronous training only).
        ({0, 1}, [], {}, [0], [1], 1, 1),
        ({0, 1, 2, 3}, [], {}, [0, 1], [2, 3], 2, 1),
        ({0, 1, 2, 3, 4, 5, 6, 7}, [], {}, [0, 1, 2, 3], [4, 5, 6, 7], 2, 1),
        ({0, 1}, ["--searchers", "3", "--backfill", "0"], {}, [0], [1], 3, 0),
        ({0, 1}, ["--mode", "sync"], {}, [0], [1], 1, 0),
        ({0}, [], {}, None, None, 2, 0),  # one CPU: shared
        # Shared, asked for or implied: every process anywhere, two searchers.
        ({0, 1}, ["--placement", "shared"], {}, None, None, 2, 0),
        ({0, 1}, [], {"TBA_PLACEMENT": "shared"}, None, None, 2, 0),
        ({0, 1}, ["--trainer-procs", "2"], {}, None, None, 2, 0),  # FSDP ranks share the machine
        ({0, 1}, [], {"TBA_DEVICE": "cuda"}, None, None, 2, 0),  # a GPU trainer needs no core of its own
        # A CPU list given is the placement; a backfill only where asked for.
        ({0, 1}, ["--searcher-cpus", "1"], {}, [1], None, 2, 0),
        ({0, 1, 2}, ["--searcher-cpus", "0", "--trainer-cpus", "1-2"], {}, [0], [1, 2], 1, 0),
        ({0, 1}, ["--searcher-cpus", "0", "--trainer-cpus", "1", "--backfill", "2"], {}, [0], [1], 1, 2),
    ],
)
def test_placement_defaults(monkeypatch, allowed, argv, env, searcher_cpus, trainer_cpus, searchers, backfill) -> None:
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: set(allowed))
    args = parse(monkeypatch, argv, env)
    check_args(args)
    placed = (args.searcher_cpus, args.trainer_cpus, args.searchers, args.backfill)
    assert placed == (searcher_cpus, trainer_cpus, searchers, backfill)


@pytest.mark.parametrize(
    ("argv", "paced"),
    [([], False), (["--mode", "sync"], False), (["--placement", "shared"], True)],
)
def test_service_defaults_follow_the_placement(monkeypatch, argv, paced) -> None:
    """Small batches scored at once everywhere; searchers paced to a batch per version only where they share the
    trainer's cores; each engine's worker on a core of its own; the reference pass on the trainer only where
    search and training have cores of their own."""
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {0, 1})
    args = parse(monkeypatch, argv)
    check_args(args)
    assert service_defaults(args, "all") == ({} if paced else {"TBA_REF_PASS": "trainer"})
    trainer = service_defaults(args, "trainer")
    assert trainer["TBA_LR_SCHEDULE"] == "wsd" and trainer["TBA_LR_DECAY_FRACTION"] == "0.5"
    assert trainer["TBA_TORCH_THREADS"] == "1"
    first = service_defaults(args, "searcher", 0)
    assert first["TBA_PROMPTS_PER_BATCH"] == "8" and first["TBA_REF_NICE"] == "0"
    assert ("TBA_MAX_BATCHES_PER_VERSION" in first) == paced
    if args.backfill:  # the backfill searcher's worker on the trainer's core, the first searcher's on CPU 0
        assert service_defaults(args, "searcher", args.searchers)["VLLM_CPU_OMP_THREADS_BIND"] == "1"
        assert first["VLLM_CPU_OMP_THREADS_BIND"] == "0"
    elif args.searchers > 1:
        assert service_defaults(args, "searcher", 1)["VLLM_CPU_OMP_THREADS_BIND"] == "1", (
            "engines spread over the cores"
        )


def test_print_config_shows_every_setting_and_where_it_comes_from(monkeypatch, capsys) -> None:
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {0, 1})
    args = parse(monkeypatch, ["--print-config", "--minutes", "2"], {"TBA_PROMPTS_PER_BATCH": "4"})
    assert main(args) == 0
    text = capsys.readouterr().out
    assert "[trainer]" in text and "[searcher-0]" in text and "[searcher-1]" in text  # the backfill searcher too
    assert "TBA_LR_SCHEDULE       = 'wsd'           # profile default.toml" in text
    assert "TBA_MAX_SECONDS       = '120'           # tba up flags" in text
    assert "TBA_PROMPTS_PER_BATCH     = '4'             # environment" in text  # the environment wins
    assert "VLLM_CPU_OMP_THREADS_BIND = '1'             # placement" in text
    layers = config_layers(args)
    assert layers["searcher-0"]["TBA_REF_PASS"] == ("trainer", "profile default.toml")


def test_another_profile_replaces_the_defaults_and_a_bad_one_is_named(monkeypatch, tmp_path) -> None:
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {0, 1})
    own = tmp_path / "mine.toml"
    own.write_text('[trainer]\nTBA_LR_SCHEDULE = "constant"\n\n[searcher.shared-cores]\nTBA_PROMPTS_PER_BATCH = 2\n')
    args = parse(monkeypatch, ["--profile", str(own), "--placement", "shared"])
    check_args(args)
    assert service_defaults(args, "trainer") == {"TBA_LR_SCHEDULE": "constant", "TBA_TORCH_THREADS": "1"}
    assert service_defaults(args, "searcher")["TBA_PROMPTS_PER_BATCH"] == "2"
    for text, says in [
        ('[trainer]\nTBA_LR_SHEDULE = "wsd"\n', "[trainer] TBA_LR_SHEDULE: not a setting of any service"),
        ("[tranier]\nTBA_LR = 1\n", "[tranier] is not one of all, trainer, searcher, buffer"),
        ("[searcher.on-gpus]\nTBA_REF_NICE = 1\n", "[searcher.on-gpus]: no such condition"),
        ("[trainer\n", "profile"),
    ]:
        own.write_text(text)
        with pytest.raises(UsageError, match="--profile") as err:
            check_args(parse(monkeypatch, ["--profile", str(own)]))
        assert says in str(err.value)
    with pytest.raises(UsageError, match="not a packaged profile \\(default"):
        check_args(parse(monkeypatch, ["--profile", "fastest"]))


def test_a_profile_sets_the_run_itself_and_the_command_line_wins(monkeypatch, tmp_path) -> None:
    """[run] gives tba up's flags (task, base model, budget, evaluations, backfill); a flag given wins over it; the
    profile's settings for the searchers are what the run's own evaluations read (its task options here)."""
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {0, 1})
    monkeypatch.delenv("TBA_TASK", raising=False)
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    own = tmp_path / "recipe.toml"
    own.write_text(
        f'base = "default"\n[run]\ntask = "arithmetic"\nbase-model = "{model}"\nminutes = 3\neval-prompts = 16\n'
        "backfill = 0\n[searcher]\nTBA_TASK_OPTIONS = '{\"digits\": 3}'\nTBA_MAX_NEW_TOKENS = 12\n"
    )
    args = parse(monkeypatch, ["--profile", str(own)])
    check_args(args)
    assert (args.task, args.base_model, args.minutes, args.eval_prompts, args.backfill) == (
        "arithmetic",
        model.resolve(),
        3.0,
        16,
        0,
    )
    assert args.eval_every == 30.0  # not in the profile: tba up's own default
    assert args.searcher_settings.task_options == {"digits": 3} and args.searcher_settings.max_new_tokens == 12
    layers = config_layers(args)
    assert layers["run"]["--minutes"] == ("3.0", "profile recipe.toml over default.toml")
    assert layers["run"]["--eval-every"] == ("30.0", "tba up's default")
    # The base profile's settings stand where this one is silent.
    assert service_defaults(args, "trainer")["TBA_LR_SCHEDULE"] == "wsd"
    flags = parse(monkeypatch, ["--profile", str(own), "--minutes", "10", "--eval-prompts", "200"])
    check_args(flags)
    assert (flags.minutes, flags.eval_prompts) == (10.0, 200)  # the command line wins, even at tba up's default
    assert config_layers(flags)["run"]["--minutes"] == ("10.0", "tba up flags")
    monkeypatch.setenv("TBA_MAX_NEW_TOKENS", "20")
    env = parse(monkeypatch, ["--profile", str(own)])
    check_args(env)
    assert env.searcher_settings.max_new_tokens == 20  # the environment wins over the profile


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("[run]\nminutes = 'long'\n", "[run] minutes: 'long' is not a number"),
        ("[run]\nsearcher = 2\n", "[run] searcher: not one of task, base-model"),
        ("[run]\nbackfill = true\n", "[run] backfill: True is not an integer"),
        ('base = "mine.toml"\n', "must name another profile"),
        ('base = "nowhere"\n', "not a packaged profile"),
    ],
)
def test_a_bad_run_table_or_base_is_named(monkeypatch, tmp_path, text, says) -> None:
    own = tmp_path / "mine.toml"
    own.write_text(text)
    with pytest.raises(UsageError, match="--profile") as err:
        check_args(parse(monkeypatch, ["--profile", str(own)]))
    assert says in str(err.value)


@pytest.mark.parametrize(("mode", "ahead"), [("async", 64), ("sync", None)])
def test_the_on_policy_loop_runs_the_real_model_profile_without_its_cap_on_samples_ahead(
    monkeypatch, mode, ahead
) -> None:
    """The exactly on-policy trainer never draws older versions' samples: counted as ahead for good, they would
    pause its searchers for good. ``--mode sync`` turns the profile's cap off, and says so where settings are shown."""
    args = parse(monkeypatch, ["--profile", "real-model", "--mode", mode])
    check_args(args)
    assert args.searcher_settings.max_samples_ahead == ahead
    shown = config_layers(args)["searcher-0"]["TBA_MAX_SAMPLES_AHEAD"]
    assert shown == (("64", "profile real-model.toml over default.toml") if ahead else ("off", "tba up flags"))
    assert config_layers(args)["trainer"]["TBA_MODE"] == (mode, "tba up flags")


def test_the_real_model_profile_is_the_recipe_the_trl_peer_runs(monkeypatch) -> None:
    """The packaged recipe resolves, and the peer (experiments/peer.py) reads the same work from it as tba up gives
    the searchers: model, task, options, completion length, prompt form, temperature and held-out prompts."""
    from experiments.peer import recipe
    from tba.local.checks import profile_env
    from tba.local.profile import Profile
    from tba.settings import SearcherSettings, load_settings

    monkeypatch.delenv("TBA_TASK", raising=False)
    profile = Profile.load("real-model")
    assert profile.run["base-model"] == "smollm2-135m-instruct" and profile.run["backfill"] == 0
    work = recipe("real-model")
    with profile_env(profile.settings("searcher", None)):
        searcher = load_settings(SearcherSettings, task=profile.run["task"])
    assert work["task"] == "reasoning-gym" and work["task_options"] == searcher.task_options
    assert work["task_options"]["reader"] == "lenient" and work["task_options"]["dataset"] == "aiw"
    assert (work["max_new_tokens"], work["temperature"], work["system_prompt"]) == (
        searcher.max_new_tokens,
        searcher.temperature,
        searcher.system_prompt,
    )
    assert work["eval_prompts"] == profile.run["eval-prompts"] == 48
    assert work["dtype"] == profile.settings("trainer", None)["TBA_DTYPE"] == "bfloat16"  # the peer's precision
    monkeypatch.setenv("TBA_DTYPE", "float32")
    assert recipe("real-model")["dtype"] == "float32"  # the environment wins, as for tba up
