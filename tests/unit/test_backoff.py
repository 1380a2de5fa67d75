"""``Backoff``: the one wait policy of every connect-and-wait loop (virtual clock)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from enumerator_service import Backoff


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _delays(backoff: Backoff, clock: _Clock) -> list[float]:
    delays = []
    while (delay := backoff.next_delay()) is not None:
        delays.append(delay)
        clock.now += delay
    return delays


def test_delays_double_up_to_the_cap_and_end_within_the_patience() -> None:
    clock = _Clock()
    delays = _delays(Backoff(10.0, clock=clock), clock)
    assert delays == [0.1, 0.2, 0.4, 0.8, 1.6, 2.0, 2.0, 2.0]  # 9.1 s; 2 more would pass 10
    assert clock.now == pytest.approx(109.1)


def test_no_patience_gives_up_at_once() -> None:
    clock = _Clock()
    assert Backoff(0.0, clock=clock).next_delay() is None


def test_the_time_spent_trying_counts_against_the_patience() -> None:
    clock = _Clock()
    backoff = Backoff(1.0, first=0.2, cap=5.0, clock=clock)
    assert backoff.next_delay() == 0.2
    clock.now += 0.9  # the slept 0.2 s and a slow attempt
    assert backoff.next_delay() is None  # 0.4 more would end past 1.0


@given(
    patience=st.floats(0.0, 120.0),
    first=st.floats(0.01, 1.0),
    cap=st.floats(1.0, 10.0),
    attempt=st.floats(0.0, 3.0),
)
def test_a_wait_never_outlasts_its_patience(
    patience: float, first: float, cap: float, attempt: float
) -> None:
    clock = _Clock()
    backoff = Backoff(patience, first=first, cap=cap, clock=clock)
    previous = 0.0
    while True:
        clock.now += attempt  # each try takes its time
        delay = backoff.next_delay()
        if delay is None:
            break
        assert delay <= max(cap, first) and delay >= min(previous, cap)
        previous = delay
        clock.now += delay
        assert clock.now <= 100.0 + patience + attempt
