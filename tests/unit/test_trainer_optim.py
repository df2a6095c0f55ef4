"""Learning-rate schedules and the trainer's settings cross-checks."""

from __future__ import annotations

import pytest
import torch

from services.trainer.optim import LRSchedule, build_optimizer
from tba.settings import SettingsError, TrainerSettings, load_settings


def test_warmup_then_constant() -> None:
    s = LRSchedule("constant", warmup_steps=3)
    assert [s(i) for i in range(5)] == pytest.approx([0.25, 0.5, 0.75, 1.0, 1.0])


def test_linear_decays_to_zero_at_max_steps() -> None:
    s = LRSchedule("linear", warmup_steps=0, max_steps=10)
    assert s(0) == 1.0 and s(5) == pytest.approx(0.5) and s(10) == 0.0 and s(12) == 0.0


def test_wsd_is_stable_then_decays_over_the_last_fraction() -> None:
    s = LRSchedule("wsd", warmup_steps=2, max_steps=100, decay_fraction=0.2)
    assert s(0) == pytest.approx(1 / 3) and s(2) == 1.0 and s(79) == 1.0
    assert s(80) == 1.0 and s(90) == pytest.approx(0.5) and s(100) == 0.0


def test_a_data_decay_follows_the_samples_trained_and_the_run_end_still_applies() -> None:
    data = LRSchedule("constant", warmup_steps=2, data_decay_start=10, data_decay_steps=20, min_ratio=0.1)
    assert data(0) == pytest.approx(1 / 3) and data(2) == 1.0 and data(10) == 1.0
    assert data(20) == pytest.approx(0.55) and data(30) == pytest.approx(0.1) and data(10_000) == pytest.approx(0.1)
    assert data(20, seconds=1e9) == data(20), "a constant schedule's data decay plays no part for the clock"
    assert LRSchedule("constant", data_decay_start=0, data_decay_steps=4)(2) == pytest.approx(0.5), "to 0 by default"
    both = LRSchedule(
        "wsd", max_seconds=100.0, decay_fraction=0.5, data_decay_start=0, data_decay_steps=10, min_ratio=0.3
    )
    assert both(5, seconds=10.0) == pytest.approx(0.65), "the data decay, before the run's"
    assert both(50, seconds=60.0) == pytest.approx(0.3), "held at its floor"
    assert both(50, seconds=90.0) == pytest.approx(0.2), "the end of the run takes it below the floor"


def test_the_data_decay_is_given_in_samples_and_switched_off_by_name(monkeypatch) -> None:
    s = load_settings(TrainerSettings, lr_decay_start_samples=6400, lr_decay_samples=3200, lr_min_ratio=0.2)
    assert (s.lr_decay_start_samples, s.lr_decay_samples, s.lr_min_ratio) == (6400, 3200, 0.2)
    schedule = LRSchedule.from_settings(s.model_copy(update={"prompts_per_step": 8, "train_samples_per_prompt": 8}))
    assert (schedule.data_decay_start, schedule.data_decay_steps, schedule.min_ratio) == (100, 50, 0.2)
    monkeypatch.setenv("TBA_LR_DECAY_START_SAMPLES", "off")
    off = load_settings(TrainerSettings)
    assert off.lr_decay_start_samples is None and LRSchedule.from_settings(off)(10**9) == 1.0
    with pytest.raises(SettingsError, match="TBA_LR_MIN_RATIO"):
        load_settings(TrainerSettings, lr_min_ratio=1.5)
    with pytest.raises(SettingsError, match="TBA_LR_DECAY_SAMPLES"):
        load_settings(TrainerSettings, lr_decay_samples=0)


def test_scheduler_drives_adamw() -> None:
    model = torch.nn.Linear(2, 1)
    opt, sched = build_optimizer(model, 0.1, 0.0, LRSchedule("linear", max_steps=4))
    lrs = []
    for _ in range(4):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert lrs == pytest.approx([0.1, 0.075, 0.05, 0.025])


@pytest.mark.parametrize(
    "overrides, names",
    [
        ({"beta_start": 0.1, "beta_end": 0.05}, ["TBA_BETA_END", "TBA_BETA_ANNEAL_STEPS"]),
        ({"lr_schedule": "wsd"}, ["TBA_LR_SCHEDULE", "TBA_MAX_STEPS", "TBA_MAX_SECONDS"]),
        ({"lr_warmup_steps": 10, "max_steps": 5}, ["TBA_LR_WARMUP_STEPS"]),
        ({"train_samples_per_prompt": 1}, ["TBA_TRAIN_SAMPLES_PER_PROMPT"]),
        ({"loss": "ppo"}, ["TBA_LOSS"]),
    ],
)
def test_bad_trainer_settings_name_the_variable(overrides, names) -> None:
    with pytest.raises(SettingsError) as err:
        load_settings(TrainerSettings, **overrides)
    for name in names:
        assert name in str(err.value)


def test_beta_end_defaults_to_beta_start_and_anneal_accepts_both() -> None:
    assert load_settings(TrainerSettings, beta_start=0.2).beta_end is None
    s = load_settings(TrainerSettings, beta_start=0.014, beta_end=0.004, beta_anneal_steps=500)
    assert (s.beta_start, s.beta_end, s.beta_anneal_steps) == (0.014, 0.004, 500)


def test_a_time_budget_decays_like_a_step_budget_and_the_nearer_end_wins() -> None:
    by_time = LRSchedule("wsd", max_seconds=100.0, decay_fraction=0.5)
    assert by_time(10, seconds=10.0) == 1.0 and by_time(10, seconds=50.0) == 1.0
    assert by_time(10, seconds=75.0) == pytest.approx(0.5) and by_time(10, seconds=120.0) == 0.0
    linear = LRSchedule("linear", max_seconds=10.0)
    assert linear(0, seconds=2.5) == pytest.approx(0.75)
    both = LRSchedule("wsd", max_steps=100, max_seconds=100.0, decay_fraction=0.5)
    assert both(90, seconds=10.0) == pytest.approx(0.2), "steps nearer their end than time"
    assert both(10, seconds=90.0) == pytest.approx(0.2), "time nearer its end than steps"
    with pytest.raises(ValueError, match="max_steps or max_seconds"):
        LRSchedule("wsd")(0)
