"""Pacing rules of the searcher (pure logic; the loop's use of it is in the searcher process test)."""

from services.searcher.pacing import Pacer


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
    assert pacer.should_wait(5)
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
