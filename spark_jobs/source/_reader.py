"""SourceReader: the non-blocking, mailbox-thread side of a FLIP-27 source."""

from __future__ import annotations

import enum
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from datetime import datetime, timedelta
from typing import Any, Protocol

from enumerator_service import SplitAssignment, SplitState
from spark_jobs.source._events import Event
from spark_jobs.source._fetcher import HandoffQueue, SplitFetcher
from spark_jobs.source._format_router import FormatRouter, Record
from spark_jobs.source._records import RawLine

__all__ = ["InputStatus", "ReaderOutput", "SourceReader"]


class InputStatus(enum.Enum):
    MORE_AVAILABLE = "more"
    NOTHING_AVAILABLE = "nothing"
    END_OF_INPUT = "end"


class ReaderOutput(Protocol):
    """Where the reader emits (implemented by the task)."""

    def split_added(self, assignment: SplitAssignment, state: SplitState) -> None: ...
    def collect(self, event: Event, timestamp: int) -> None: ...
    def dead_letter(self, split_id: int, line: RawLine, reason: str) -> None: ...
    def split_finished(self, split_id: int, state: SplitState) -> None: ...


class SourceReader:
    """Emits one element per ``poll_next`` call. Mailbox thread only; never blocks.

    The record emitter step (parse, event time, per-split watermark with bounded
    out-of-orderness) updates each split's state *as it emits*, so a snapshot taken between two
    calls is exact.
    """

    def __init__(
        self,
        fetcher: SplitFetcher,
        handoff: HandoffQueue,
        router: FormatRouter,
        *,
        out_of_orderness: timedelta = timedelta(seconds=5),
        idle_timeout: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._fetcher = fetcher
        self._handoff = handoff
        self._router = router
        self._delay = out_of_orderness
        self._states: dict[int, SplitState] = {}
        self._max_event_time: dict[int, datetime] = {}
        self._idle_timeout = idle_timeout
        self._clock = clock
        self._last_record: dict[int, float] = {}  # split -> clock time of its last record
        self._lines: deque[Record] = deque()
        self._lines_split = -1
        self._finished: deque[int] = deque()
        self._pending_batches: deque[tuple[int, list[Any]]] = deque()
        self._end_of_input = False

    def start(self) -> None:
        self._fetcher.start()

    def close(self) -> None:
        self._fetcher.shutdown()

    def is_available(self) -> Future[None]:
        return self._handoff.availability()

    @property
    def split_states(self) -> dict[int, SplitState]:
        return self._states

    def watermark(self) -> datetime | None:
        """The task watermark: the minimum over the active splits' watermarks.

        A split that emitted nothing for ``idle_timeout`` seconds is idle and does not hold the
        watermark back; its next record makes it active again. None while no split has one.
        """
        cutoff = self._clock() - self._idle_timeout
        marks = [
            state.watermark
            for split_id, state in self._states.items()
            if state.watermark is not None and self._last_record.get(split_id, cutoff) > cutoff
        ]
        return min(marks) if marks else None

    def idle_splits(self) -> list[int]:
        cutoff = self._clock() - self._idle_timeout
        return sorted(s for s in self._states if self._last_record.get(s, cutoff) <= cutoff)

    def poll_next(self, output: ReaderOutput) -> InputStatus:
        while True:
            if self._lines:
                self._emit(self._lines.popleft(), output)
                return InputStatus.MORE_AVAILABLE
            if self._pending_batches:
                self._lines_split, lines = self._pending_batches.popleft()
                self._lines.extend(lines)
                continue
            if self._finished:
                split_id = self._finished.popleft()
                output.split_finished(split_id, self._states.pop(split_id))
                self._max_event_time.pop(split_id, None)
                self._last_record.pop(split_id, None)
                self._router.split_done(split_id)
                return InputStatus.MORE_AVAILABLE
            if self._end_of_input:
                return InputStatus.END_OF_INPUT
            item = self._handoff.poll()
            if item is None:
                return InputStatus.NOTHING_AVAILABLE
            if isinstance(item, BaseException):
                raise item
            for assignment in item.added:
                state = assignment.initial_state()
                self._states[assignment.split_id] = state
                output.split_added(assignment, state)
            self._pending_batches.extend(item.records.items())
            self._finished.extend(item.finished)
            self._end_of_input = item.end_of_input

    def _emit(self, record: Record, output: ReaderOutput) -> None:
        split_id = self._lines_split
        state = self._states[split_id]
        parsed = self._router.parse(split_id, record)
        state.offset = record.next_offset
        if parsed is None:
            return
        if isinstance(parsed, str):
            state.dead_letters += 1
            line = record if isinstance(record, RawLine) else record.as_raw_line()
            output.dead_letter(split_id, line, parsed)
            return
        state.records += 1
        self._last_record[split_id] = self._clock()
        event_time = parsed.event_time
        latest = self._max_event_time.get(split_id)
        if latest is None or event_time > latest:
            self._max_event_time[split_id] = event_time
            state.watermark = event_time - self._delay
        output.collect(parsed, int(event_time.timestamp() * 1000))
