"""Pacing rules of the searcher (pure logic; the loop's use of it is in the searcher process test)."""

from services.searcher.pacing import POLICY, TRAINER, Pacer


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_unpaced_searchers_never_wait() -> None:
    pacer = Pacer(None, 30.0)
    for _ in range(100):
        pacer.generated(0)
    assert not pacer.should_wait(0)


def test_waits_after_the_limit_until_a_newer_version_arrives() -> None:
    pacer = Pacer(2, 30.0, clock=Clock())
    pacer.generated(5)
    assert not pacer.should_wait(5)
    pacer.generated(5)
    assert pacer.should_wait(5) == POLICY
    assert not pacer.should_wait(6)  # reloaded: a new share of batches
    pacer.generated(6)
    assert not pacer.should_wait(6)


def test_a_stalled_trainer_does_not_stall_generation_for_good() -> None:
    clock = Clock()
    pacer = Pacer(1, 30.0, clock=clock)
    pacer.generated(0)
    assert pacer.should_wait(0)
    clock.t = 29.9
    assert pacer.should_wait(0)
    clock.t = 30.0
    assert not pacer.should_wait(0)  # one more batch, then wait again
    pacer.generated(0)
    clock.t = 31.0
    assert pacer.should_wait(0)


def test_a_trainer_slower_than_the_bound_is_waited_for_as_its_pace_shows() -> None:
    """Versions 100 s apart: the pause lasts up to 200 s, not 30, so the searcher does not generate a batch with a
    policy about to be replaced; the start-up's long first interval does not count."""
    clock = Clock()
    pacer = Pacer(1, 30.0, clock=clock)
    for version, at in ((0, 0.0), (1, 500.0), (2, 600.0)):
        clock.t = at
        assert not pacer.should_wait(version)
        pacer.generated(version)
    assert pacer.cycle == 100.0 and pacer.longest_wait() == 200.0
    clock.t = 601.0
    assert pacer.should_wait(2) == POLICY
    clock.t = 799.0
    assert pacer.should_wait(2) == POLICY  # past 30 s: the trainer is still within its pace
    clock.t = 801.0
    assert not pacer.should_wait(2)  # two of its intervals without a version: stalled, one more batch
    fast = Pacer(1, 30.0, clock=clock)
    for version, at in ((0, 0.0), (1, 100.0), (2, 105.0)):
        clock.t = at
        fast.should_wait(version)
    assert fast.longest_wait() == 30.0  # a fast trainer: the configured bound


def test_a_pause_that_ran_out_does_not_lengthen_the_next() -> None:
    """A trainer that waits for the searcher's batch (the ahead rule misled, say) publishes only after the pause
    runs out: that interval holds the pause itself, so it is not timed and the next pause is no longer."""
    clock = Clock()
    backlog = [0]
    pacer = Pacer(None, 30.0, clock=clock, max_samples_ahead=64, samples_ahead=lambda: backlog[0])
    for version, at in ((0, 0.0), (1, 100.0), (2, 160.0)):
        clock.t = at
        assert not pacer.should_wait(version)
    assert pacer.longest_wait() == 120.0
    backlog[0], clock.t = 128, 161.0
    assert pacer.should_wait(2) == TRAINER
    clock.t = 281.0
    assert not pacer.should_wait(2)  # ran out: one more batch, which the trainer was waiting for
    pacer.generated(2)
    clock.t = 341.0
    assert pacer.should_wait(3) == TRAINER and pacer.longest_wait() == 120.0  # not 2 x 181 s
    clock.t = 401.0
    pacer.should_wait(4)  # an interval without a pause running out is timed again
    assert pacer.cycle == 60.0


def test_waits_while_enough_samples_wait_for_the_trainer() -> None:
    """The ahead rule reads the backlog at every look: at or over the cap it pauses, under it it generates, and
    an unreadable backlog (Redis away) never holds generation back."""
    backlog: list[int | None] = [0]
    pacer = Pacer(None, 30.0, clock=Clock(), max_samples_ahead=64, samples_ahead=lambda: backlog[0])
    assert not pacer.should_wait(0)
    backlog[0] = 64
    assert pacer.should_wait(0) == TRAINER and pacer.ahead == 64
    backlog[0] = 63  # the trainer drew: one sample short of a batch ahead
    assert not pacer.should_wait(0)
    backlog[0] = None
    assert not pacer.should_wait(0) and pacer.ahead is None


def test_the_ahead_pause_is_bounded_too() -> None:
    clock = Clock()
    pacer = Pacer(None, 10.0, clock=clock, max_samples_ahead=8, samples_ahead=lambda: 100)
    assert pacer.should_wait(3) == TRAINER
    clock.t = 10.0
    assert not pacer.should_wait(3)
    pacer.generated(3)
    assert pacer.should_wait(3) == TRAINER


def test_the_version_rule_comes_first() -> None:
    pacer = Pacer(1, 30.0, clock=Clock(), max_samples_ahead=8, samples_ahead=lambda: 100)
    pacer.generated(0)
    assert pacer.should_wait(0) == POLICY
    assert pacer.should_wait(1) == TRAINER
