"""The lag rule: a searcher is lagging once the version it serves has been more than the staleness bound behind
the newest announced for longer than TBA_LAG_SECONDS; the clock starts when it heard of the first version over
the bound, and a reload that brings it within the bound stops it. And the tally of what it generated."""

from __future__ import annotations

from services.searcher.lag import LagTally, VersionLag


def test_within_the_bound_is_never_lagging() -> None:
    lag = VersionLag(bound=8, seconds=60.0, clock=lambda: 0.0)
    lag.heard(8, at=0.0)
    state = lag.state(served=0, now=1000.0)
    assert state.behind == 8 and state.over_since is None and not state.lagging


def test_over_the_bound_for_longer_than_the_setting_is_lagging() -> None:
    lag = VersionLag(bound=8, seconds=60.0, clock=lambda: 0.0)
    lag.heard(4, at=0.0)
    lag.heard(9, at=10.0)  # the first version more than 8 above v0: the clock starts here
    lag.heard(30, at=20.0)
    assert lag.state(served=0, now=69.0).over_seconds == 59.0 and not lag.state(served=0, now=69.0).lagging
    state = lag.state(served=0, now=70.5)
    assert state.lagging and state.over_since == 10.0 and state.behind == 30


def test_a_reload_restarts_the_clock_from_the_first_version_still_over_the_bound() -> None:
    lag = VersionLag(bound=8, seconds=60.0, clock=lambda: 0.0)
    for version, t in ((9, 0.0), (20, 50.0), (40, 100.0)):
        lag.heard(version, at=t)
    assert lag.state(served=0, now=100.0).lagging  # over since t=0
    state = lag.state(served=20, now=100.0)  # reloaded to v20: only v40 is over the bound, heard at 100
    assert state.over_since == 100.0 and not state.lagging
    assert not lag.state(served=32, now=1000.0).lagging  # v32: 40 is within 8


def test_announcements_out_of_order_count_once_and_no_bound_never_lags() -> None:
    lag = VersionLag(bound=2, seconds=1.0, clock=lambda: 0.0)
    lag.heard(10, at=0.0)
    lag.heard(5, at=1.0)  # older than one heard: no change
    assert lag.newest == 10 and lag.state(served=0, now=5.0).over_since == 0.0
    unbounded = VersionLag(bound=None, seconds=1.0, clock=lambda: 0.0)
    unbounded.heard(10_000, at=0.0)
    assert not unbounded.state(served=0, now=1e6).lagging


def test_the_clock_is_the_callers() -> None:
    now = [5.0]
    lag = VersionLag(bound=0, seconds=2.0, clock=lambda: now[0])
    lag.heard(1)  # heard at 5.0
    now[0] = 7.5
    assert lag.state(served=0).lagging


def test_tally_weights_by_samples_and_counts_those_too_stale() -> None:
    tally = LagTally(bound=8)
    assert tally.lag_mean is None
    tally.add(samples=30, lag=0)
    tally.add(samples=10, lag=20)  # too stale to train on
    tally.add(samples=10, lag=8)  # at the bound: still trainable
    assert tally.samples == 50 and tally.too_stale == 10 and tally.lag_max == 20
    assert tally.lag_mean == (10 * 20 + 10 * 8) / 50
    unbounded = LagTally(bound=None)
    unbounded.add(samples=5, lag=1000)
    assert unbounded.too_stale == 0
