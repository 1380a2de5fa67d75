"""``bench/e2e.py``: end-to-end latency of the stream sources — percentiles and the verdict.

A continuous run at a steady input rate; each record's time from produce (or commit, for
CDC) to visible in the committed output is one sample. The target (the issue's): p99 <= the
pipeline's checkpoint interval + 1 s. :class:`Poller` is the rows' watcher of the output.

Threading: a ``Poller`` is a daemon thread; its ``look`` runs there, everything else on the
caller's thread.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from _harness import verdict_line

__all__ = ["POLL", "Latency", "Poller", "latency_verdict", "percentile"]

SLACK_SECONDS = 1.0  # target: p99 <= checkpoint interval + this
POLL = 0.05  # the pollers' period: a sample is late by up to this much


class Poller(threading.Thread):
    """Calls ``look(now)`` every ``POLL`` s until stopped (``now``: ``clock()`` as the look
    starts; a record it finds first counts as visible then). The first error ends it
    (``error``)."""

    def __init__(
        self, name: str, look: Callable[[float], None], clock: Callable[[], float]
    ) -> None:
        super().__init__(name=name, daemon=True)
        self._look, self._clock = look, clock
        self.stop = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            while not self.stop.is_set():
                self._look(self._clock())
                time.sleep(POLL)
        except BaseException as exc:  # raised by catch_up
            self.error = exc

    def catch_up(
        self, done: Callable[[], bool], run: threading.Thread, outcome: Any, seconds: float
    ) -> None:
        """Wait until ``done()`` (the output holds every record offered), then stop; fails
        when the run or this poller died, or after ``seconds``."""
        deadline = time.monotonic() + seconds
        while not done():
            assert run.is_alive() and self.is_alive(), (outcome, self.error)
            assert time.monotonic() < deadline, "the output did not catch up"
            time.sleep(POLL)
        self.stop.set()
        self.join()


def percentile(samples: list[float], share: float) -> float:
    """The nearest-rank percentile (``share`` in 0..1) of ``samples`` (not empty)."""
    ordered = sorted(samples)
    rank = max(1, min(len(ordered), round(share * len(ordered) + 0.5)))
    return ordered[rank - 1]


@dataclass
class Latency:
    """What a latency run measured (seconds)."""

    name: str  # e.g. "CDC: commit -> visible in the sink"
    samples: list[float]
    rate: float  # records/s offered
    seconds: float  # how long they were offered
    interval: float  # the pipeline's checkpoint interval
    load: tuple[float, float, float]
    note: str = ""

    @property
    def p50(self) -> float:
        return percentile(self.samples, 0.50)

    @property
    def p99(self) -> float:
        return percentile(self.samples, 0.99)


def latency_verdict(latency: Latency | None, name: str) -> str:
    if latency is None or not latency.samples:
        return verdict_line(None, f"{name} latency p99 <= checkpoint interval + 1 s (not measured)")
    target = latency.interval + SLACK_SECONDS
    load = " ".join(f"{x:.2f}" for x in latency.load)
    return verdict_line(
        latency.p99 <= target,
        f"{latency.name}: p50 {latency.p50:.2f} s, p99 {latency.p99:.2f} s, max "
        f"{max(latency.samples):.2f} s over {len(latency.samples):,} records at "
        f"{latency.rate:,.0f}/s for {latency.seconds:.0f} s (target p99 <= checkpoint interval "
        f"{latency.interval:g} s + {SLACK_SECONDS:g} s = {target:g} s; load {load})"
        + (f"; {latency.note}" if latency.note else ""),
    )
