"""A task's watermark: when it enters the operator chain, and what reached the sink.

The task watermark is the reader's (``SourceReaderBase.watermark``: the minimum over the
active splits). It enters the chain as a :class:`~spark_jobs.async_io.Watermark` marker
(epoch milliseconds, UTC) only when it *advances* past the last marker — a split that joins
with an older watermark lowers the minimum, but markers never go backwards — and at a
bounded rate: at most one per emitted block, and while blocks flow at most one per
:data:`WATERMARK_INTERVAL`. When input pauses (no block waiting) or on the periodic tick,
the advance is offered without the interval (``force``), so the last advance of a burst
and a split going idle still reach the sink.

The *sink-side* watermark is the last marker that left the last stage: every record before
it was handed to the sink. A checkpoint snapshot carries it (``snapshot["watermark"]``,
see ``TaskCheckpoints._on_trigger``).

Threading: mailbox thread only.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from spark_jobs.async_io import Watermark
from spark_jobs.runtime._timers import TimerHandle, TimerService

__all__ = ["WATERMARK_INTERVAL", "TaskWatermarks", "from_millis", "to_millis"]

#: Seconds between two markers while blocks flow. Flink's default auto-watermark interval
#: (``pipeline.auto-watermark-interval``) is 200 ms: frequent enough that completeness lags
#: event time by well under a checkpoint interval, rare enough that a marker (which takes a
#: slot in every async stage and is a boundary in unordered mode) costs nothing measurable
#: next to blocks of thousands of records.
WATERMARK_INTERVAL = 0.2

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MS = timedelta(milliseconds=1)


def to_millis(moment: datetime) -> int:
    """Epoch milliseconds of ``moment`` (naive = UTC), rounded down: a watermark may only
    claim less than it knows."""
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return (moment - _EPOCH) // _MS


def from_millis(millis: int) -> datetime:
    return _EPOCH + timedelta(milliseconds=millis)


class TaskWatermarks:
    """Decides when the task watermark (``current()``: None while it must not advance)
    enters the chain (``push``), and records the last marker that reached the sink."""

    def __init__(
        self,
        push: Callable[[Watermark], None],
        current: Callable[[], datetime | None],
        *,
        interval: float = WATERMARK_INTERVAL,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._push = push
        self._current = current
        self._interval = interval
        self._clock = clock
        self._last_push = float("-inf")
        self._timers: TimerService | None = None
        self._tick: TimerHandle | None = None
        #: The last marker pushed into the chain (epoch ms), None before the first.
        self.emitted: int | None = None
        #: The last marker that reached the sink (epoch ms), None before the first.
        self.at_sink: int | None = None

    def resume(self, committed: datetime | None) -> None:
        """A retried attempt: the sink had reached ``committed`` at the last completed
        checkpoint (see ``committed_task_watermark``); markers go on from there."""
        if committed is not None:
            self.emitted = self.at_sink = to_millis(committed)

    def start(self, timers: TimerService) -> None:
        """Offer every ``interval`` too (a split going idle advances the watermark without
        a new block), until :meth:`stop`."""
        self._timers = timers
        self._tick = timers.register(timers.now() + self._interval, self._on_tick)

    def stop(self) -> None:
        if self._tick is not None:
            self._tick.cancel()
        self._tick = self._timers = None

    def _on_tick(self) -> None:
        self._tick = None
        timers = self._timers
        if timers is None:
            return  # stopped meanwhile
        self.offer(force=True)
        self._tick = timers.register(timers.now() + self._interval, self._on_tick)

    def offer(self, *, force: bool = False) -> bool:
        """Push a marker for ``current()`` if it advances past the last one and the rate
        allows (``force``: ignore the interval). True when a marker was pushed."""
        now = self._clock()
        if not force and now - self._last_push < self._interval:
            return False  # checked first: this runs once per block
        current = self._current()
        if current is None:
            return False
        millis = to_millis(current)
        if self.emitted is not None and millis <= self.emitted:
            return False
        self.emitted = millis
        self._last_push = now
        self._push(Watermark(millis))
        return True

    def reached_sink(self, marker: Watermark) -> None:
        if self.at_sink is not None and marker.timestamp < self.at_sink:
            raise AssertionError(f"watermark {marker.timestamp} behind {self.at_sink} at the sink")
        self.at_sink = marker.timestamp

    def sink_watermark(self) -> str | None:
        """The sink-side watermark as ISO-8601 UTC (``snapshot["watermark"]``), or None."""
        return None if self.at_sink is None else from_millis(self.at_sink).isoformat()
