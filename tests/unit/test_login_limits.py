"""The server-wide login limiter on a clock of the test's own: per address, in all, the lockout's
backoff, a right password's reset, and many threads guessing at once."""

from __future__ import annotations

import threading
from collections import Counter

import pytest

from oncewatch.dashboards.login_limits import ADDRESS, SERVER, Limits, LoginLimiter, Refusal

LIMITS = Limits()


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def limiter(clock: Clock) -> LoginLimiter:
    return LoginLimiter(clock=clock)


def guess(limiter: LoginLimiter, address: str) -> Refusal | None:
    """One wrong password: refused, or taken and counted as a failure."""
    refusal = limiter.admit(address)
    if refusal is None:
        limiter.failed(address)
    return refusal


def test_the_stated_limits() -> None:
    assert (LIMITS.per_address, LIMITS.overall, LIMITS.window_seconds) == (5, 30, 60.0)
    assert [LIMITS.lockout_seconds(n) for n in range(1, 12)] == [0, 0, 0, 0, 30, 60, 120, 240, 480, 900, 900]
    assert LIMITS.lockout_seconds(10_000) == 900


def test_five_tries_per_address_per_minute(limiter: LoginLimiter, clock: Clock) -> None:
    for _ in range(4):
        assert limiter.admit("10.0.0.1") is None
        assert limiter.failed("10.0.0.1").retry_after == 0
        clock.now += 1
    assert limiter.admit("10.0.0.1") is None
    fifth = limiter.failed("10.0.0.1")
    assert (fifth.failures, fifth.retry_after) == (5, 56.0)  # the first try leaves the window at +60 s
    refusal = limiter.admit("10.0.0.1")
    assert (refusal.reason, refusal.retry_after, refusal.failures, refusal.refused) == (ADDRESS, 56.0, 5, 1)
    assert limiter.admit("10.0.0.2") is None  # another address is not held back


def test_thirty_tries_per_minute_from_all_addresses(limiter: LoginLimiter, clock: Clock) -> None:
    for i in range(LIMITS.overall):
        assert guess(limiter, f"10.0.1.{i}") is None
    clock.now += 10
    refusal = limiter.admit("10.0.2.1")
    assert (refusal.reason, refusal.retry_after, refusal.failures) == (SERVER, 50.0, 0)
    assert limiter.admit("10.0.2.2").refused == 2  # refused tries in a row, counted for the log
    clock.now += 50
    assert limiter.admit("10.0.2.1") is None


def test_lockout_doubles_up_to_fifteen_minutes(limiter: LoginLimiter, clock: Clock) -> None:
    """An address that guesses as fast as it is let: 5 tries, then one each time its lockout ends."""
    taken = []
    for _ in range(6 * 3600):  # six hours, one attempt a second
        if limiter.admit("10.0.0.9") is None:
            taken.append(clock.now)
            limiter.failed("10.0.0.9")
        clock.now += 1
    gaps = [round(b - a) for a, b in zip(taken, taken[1:])]
    # the 6th when the 1st leaves the minute, then lockouts of 60 s, 120 s, ... after each failure
    assert gaps[:9] == [1, 1, 1, 1, 56, 60, 120, 240, 480]
    assert set(gaps[9:]) == {900} and len(gaps[9:]) >= 20  # then four an hour, as long as it goes on


def test_the_right_password_forgets_the_address(limiter: LoginLimiter, clock: Clock) -> None:
    for _ in range(4):
        guess(limiter, "10.0.0.3")
    assert limiter.admit("10.0.0.3") is None
    limiter.succeeded("10.0.0.3")
    for n in range(1, 5):  # a fresh count: four more wrong ones, no lockout, no window full
        assert limiter.admit("10.0.0.3") is None
        assert (limiter.failed("10.0.0.3").failures, n) == (n, n)
    assert limiter.admit("10.0.0.3") is None
    assert limiter.failed("10.0.0.3").retry_after > 0


def test_refused_tries_are_not_counted(limiter: LoginLimiter, clock: Clock) -> None:
    for _ in range(5):
        guess(limiter, "10.0.0.4")
    for _ in range(100):
        assert guess(limiter, "10.0.0.4") is not None
    clock.now += 60
    assert guess(limiter, "10.0.0.4") is None  # the sixth failure: a minute's lockout, not more
    assert limiter.admit("10.0.0.4").retry_after == 60
    assert limiter.admit("10.0.0.5") is None  # 6 of the 30 taken, the refused ones none


def test_an_address_is_forgotten_a_day_after_its_last_try(limiter: LoginLimiter, clock: Clock) -> None:
    for _ in range(5):
        guess(limiter, "10.0.0.6")
    clock.now += LIMITS.forget_after_seconds
    assert limiter.admit("10.0.0.7") is None
    assert limiter.failed("10.0.0.6").failures == 1  # a new start, not the sixth failure


def test_many_threads_guessing_at_once_get_the_limit_and_no_more(limiter: LoginLimiter) -> None:
    """50 threads, 5 to an address, 40 guesses each at one instant: 5 per address, 30 in all."""
    taken: Counter[str] = Counter()
    lock = threading.Lock()
    start = threading.Barrier(50)

    def guesser(address: str) -> None:
        start.wait()
        for _ in range(40):
            if guess(limiter, address) is None:
                with lock:
                    taken[address] += 1

    threads = [threading.Thread(target=guesser, args=(f"10.0.3.{i % 10}",)) for i in range(50)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(taken.values()) == LIMITS.overall
    assert max(taken.values()) <= LIMITS.per_address
