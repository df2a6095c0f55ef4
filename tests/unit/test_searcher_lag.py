"""The lag rule: a searcher is lagging once the version it serves has been more than the staleness bound behind
the newest announced, without once coming back within it, for longer than TBA_LAG_SECONDS; a version heard late
counts from when it was published. And the tally of what it generated."""

from __future__ import annotations

from services.searcher.lag import LagTally, VersionLag


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_within_the_bound_is_never_lagging() -> None:
    clock = Clock()
    lag = VersionLag(bound=8, seconds=60.0, clock=clock)
    lag.heard(8)
    clock.now = 1000.0
    state = lag.state()
    assert state.behind == 8 and state.over_since is None and not state.lagging


def test_over_the_bound_for_longer_than_the_setting_is_lagging() -> None:
    clock = Clock()
    lag = VersionLag(bound=8, seconds=60.0, clock=clock)
    lag.heard(4)
    clock.now = 10.0
    lag.heard(9)  # more than 8 above v0: the clock starts here
    clock.now = 20.0
    lag.heard(30)
    assert lag.state(now=69.0).over_seconds == 59.0 and not lag.state(now=69.0).lagging
    state = lag.state(now=70.5)
    assert state.lagging and state.over_since == 10.0 and state.behind == 30


def test_a_reload_that_leaves_it_over_the_bound_does_not_restart_the_clock() -> None:
    clock = Clock()
    lag = VersionLag(bound=8, seconds=60.0, clock=clock)
    lag.heard(20)  # over since 0
    clock.now = 40.0
    lag.serving(10)  # reloaded, still 10 behind: over the bound all along
    clock.now = 61.0
    assert lag.state().lagging and lag.state().over_since == 0.0
    lag.serving(14)  # within the bound: the clock stops
    assert not lag.state().lagging and lag.state().over_since is None
    clock.now = 70.0
    lag.heard(23)  # over again from now
    assert lag.state(now=100.0).over_since == 70.0 and not lag.state(now=100.0).lagging


def test_a_version_heard_late_counts_from_when_it_was_published_not_before_what_is_served() -> None:
    clock = Clock()
    lag = VersionLag(bound=2, seconds=30.0, clock=clock)
    clock.now = 100.0
    lag.heard(10, age=40.0)  # published at 60, read only now (a starved watcher): over since 60
    assert lag.state().over_since == 60.0 and lag.state().lagging
    clock.now = 200.0
    lag.serving(10)
    lag.heard(20, age=500.0)  # published long before v10 was loaded: over since the load
    assert lag.state().over_since == 200.0


def test_announcements_out_of_order_count_once_and_no_bound_never_lags() -> None:
    clock = Clock()
    lag = VersionLag(bound=2, seconds=1.0, clock=clock)
    lag.heard(10)
    clock.now = 1.0
    lag.heard(5)  # older than one heard: no change
    assert lag.newest == 10 and lag.state(now=5.0).over_since == 0.0
    unbounded = VersionLag(bound=None, seconds=1.0, clock=clock)
    unbounded.heard(10_000)
    assert not unbounded.state(now=1e6).lagging


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


def test_a_hung_reload_or_a_lag_makes_the_searcher_unready_with_the_reason(tmp_path) -> None:
    """What /readyz answers (Searcher.ready): the reason, while a reload has not returned within
    TBA_RELOAD_TIMEOUT_SECONDS or the searcher has lagged for longer than TBA_LAG_SECONDS; ready again after."""
    from types import SimpleNamespace

    from services.searcher.loop import Searcher
    from services.searcher.watcher import CheckpointWatcher
    from tba.checkpoints import CheckpointStore
    from tba.keys import Keys
    from tba.schemas import SearcherState
    from tba.settings import SearcherSettings

    clock = Clock()
    settings = SearcherSettings(lag_seconds=60.0, reload_timeout_seconds=120.0)
    lag = VersionLag(settings.max_staleness, settings.lag_seconds, clock)
    searcher = object.__new__(Searcher)  # the readiness rule alone: no engine, no Redis
    searcher.settings, searcher.state, searcher.reloading = settings, SearcherState.RUNNING, None
    searcher.clock = clock
    searcher.engine = SimpleNamespace(version=0)
    searcher.watcher = CheckpointWatcher(lambda: None, Keys("t"), CheckpointStore(tmp_path), 5.0, lag=lag)
    assert searcher.ready() == (True, "engine loaded, version 0")
    searcher.state, searcher.reloading = SearcherState.RELOADING, (12, clock.now)
    clock.now = 119.0
    assert searcher.ready()[0]
    clock.now = 121.0
    ok, reason = searcher.ready()
    assert not ok and reason.startswith("the reload to v12 has not returned after 121 s")
    assert searcher.warning(clock.now)[0] == "reload_hung"
    searcher.state, searcher.reloading = SearcherState.RUNNING, None
    lag.heard(40)  # 40 behind from now on (121 s)
    clock.now = 182.0
    ok, reason = searcher.ready()
    assert not ok and reason.startswith("serving v0, 40 versions behind the newest announced v40")
    assert "(more than TBA_MAX_STALENESS=8) for 61 s (TBA_LAG_SECONDS=60)" in reason
    lag.serving(36)  # a reload within the bound
    searcher.engine.version = 36
    assert searcher.ready() == (True, "engine loaded, version 36")
