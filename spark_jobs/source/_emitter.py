"""RecordEmitter: turns fetched records into events and keeps each split's progress.

Runs on the mailbox thread. It updates a split's state *as it emits* (offset, records, dead
letters, watermark), so a snapshot taken between two emitted records is exact. A block of
JSON Lines (parsed on the fetcher thread) is emitted as a whole: its dead letters, then its
events as one batch; the split's offset moves to the block's end.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Protocol

from enumerator_service import SplitAssignment, SplitState
from spark_jobs.source._blocks import EventBlock
from spark_jobs.source._events import Event
from spark_jobs.source._format_router import FormatRouter, Record
from spark_jobs.source._records import RawLine

__all__ = ["ReaderOutput", "RecordEmitter"]


class ReaderOutput(Protocol):
    """Where a source emits (implemented by the task)."""

    def split_added(self, assignment: SplitAssignment, state: SplitState) -> None: ...
    def collect(self, event: Event, timestamp: int) -> None: ...
    def collect_block(self, block: EventBlock) -> None: ...
    def dead_letter(self, split_id: int, line: RawLine, reason: str) -> None: ...
    def split_finished(self, split_id: int, state: SplitState) -> None: ...


class RecordEmitter:
    """Parse (by the split's format), extract event time, track per-split watermarks.

    A split's watermark is its largest event time minus ``out_of_orderness`` (bounded
    out-of-orderness). A split that emitted nothing for ``idle_timeout`` seconds is idle and
    does not hold the task watermark back until its next record.
    """

    def __init__(
        self,
        router: FormatRouter,
        *,
        out_of_orderness: timedelta = timedelta(seconds=5),
        idle_timeout: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._router = router
        self._delay = out_of_orderness
        self._idle_timeout = idle_timeout
        self._clock = clock
        self._max_event_time: dict[int, datetime] = {}
        self._last_record: dict[int, float] = {}  # split -> clock time of its last record

    def emit(self, split_id: int, record: Record, state: SplitState, output: ReaderOutput) -> None:
        if type(record) is EventBlock:
            self._emit_block(split_id, record, state, output)
            return
        parsed = self._router.parse(split_id, record)
        state.offset = record.next_offset
        if parsed is None:
            return
        if isinstance(parsed, str):
            state.dead_letters += 1
            assert not isinstance(record, EventBlock)  # blocks are emitted above
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

    def _emit_block(
        self, split_id: int, block: EventBlock, state: SplitState, output: ReaderOutput
    ) -> None:
        state.offset = block.end
        for offset, raw, reason in block.dead:
            state.dead_letters += 1
            output.dead_letter(split_id, RawLine(offset, offset + len(raw), raw), reason)
        count = block.rows.num_rows
        if not count:
            return
        state.records += count
        self._last_record[split_id] = self._clock()
        event_time = block.max_event_time
        latest = self._max_event_time.get(split_id)
        if event_time is not None and (latest is None or event_time > latest):
            self._max_event_time[split_id] = event_time
            state.watermark = event_time - self._delay
        output.collect_block(block)

    def split_finished(self, split_id: int) -> None:
        self._max_event_time.pop(split_id, None)
        self._last_record.pop(split_id, None)
        self._router.split_done(split_id)

    def is_idle(self, split_id: int) -> bool:
        last = self._last_record.get(split_id)
        return last is None or last <= self._clock() - self._idle_timeout
