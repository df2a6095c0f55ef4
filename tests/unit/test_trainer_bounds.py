"""The reuse bound's accounting (services/trainer/bounds.py): what the trainer asks the buffer for."""

from __future__ import annotations

from services.trainer.bounds import ReuseBound

B = 64  # samples per batch


def test_no_bound_asks_for_nothing_but_measures_the_ratio():
    bound = ReuseBound(None)
    bound.start(counter=64, consumed=0, batch=B)
    assert bound.min_generated(0, B) is None
    bound.read(128)
    bound.read(128)
    assert bound.ratio(128) == 1.0  # 128 consumed, 128 generated


def test_a_fresh_run_counts_totals_warmup_included():
    bound = ReuseBound(1.0)
    bound.start(counter=64, consumed=0, batch=B)
    assert bound.offset == 0 and bound.min_generated(0, B) == 64  # the warm-up's samples cover the first batch
    bound.read(70)
    assert bound.min_generated(64, B) == 128  # 64 consumed + 64 next <= 1.0 x generated
    bound.read(130)
    assert bound.generated == 130 and bound.ratio(128) == 128 / 130


def test_a_ratio_above_one_lets_each_sample_serve_that_many_times():
    bound = ReuseBound(2.5)
    bound.start(counter=64, consumed=0, batch=B)
    consumed = B
    bound.read(64)
    assert bound.min_generated(consumed, B) == 52  # ceil(128 / 2.5)
    for _ in range(8):
        bound.read(bound.min_generated(consumed, B))
        consumed += B
    ratio = bound.ratio(consumed)
    assert ratio is not None and 2.4 < ratio <= 2.5


def test_the_bound_binds_exactly_at_the_ratio():
    """Whatever the counter does, a batch served at the counter asked for never takes the ratio past the bound."""
    bound = ReuseBound(1.5)
    bound.start(counter=100, consumed=0, batch=B)
    consumed = 0
    for _ in range(50):
        need = bound.min_generated(consumed, B)
        assert need is not None
        bound.read(need)
        consumed += B
        assert consumed <= 1.5 * bound.generated


def test_a_resumed_trainer_carries_on_where_it_stopped():
    """consumed comes from the checkpoint; an intact buffer's counter already covers it: no offset."""
    bound = ReuseBound(1.0)
    bound.start(counter=7000, consumed=6400, batch=B)
    assert bound.offset == 0 and bound.min_generated(6400, B) == 6464


def test_a_resumed_trainer_on_a_buffer_started_afresh_gets_its_first_batch_then_waits():
    bound = ReuseBound(1.0)
    bound.start(counter=64, consumed=6400, batch=B)  # Redis lost everything: the counter restarted
    assert bound.min_generated(6400, B) == 64  # no wait for the 6,400 samples counted before
    bound.read(64)
    assert bound.min_generated(6464, B) == 128  # then one new sample per sample consumed


def test_a_counter_that_goes_back_mid_run_is_counted_on_from_before():
    bound = ReuseBound(1.0)
    bound.start(counter=64, consumed=0, batch=B)
    for counter in (64, 128, 192, 256):
        bound.read(counter)
    bound.read(10)  # the buffer's Redis restarted empty: 10 new samples since
    assert bound.generated == 266
    assert bound.min_generated(256, B) == 64  # 320 in all, of which 256 were counted before the restart
