"""RecordEmitter: hands fetched blocks to the task and keeps each split's progress.

Runs on the mailbox thread. It updates a split's state *as it emits* (offset, records, dead
letters, watermark), so a snapshot taken between two emitted blocks is exact. A block was
parsed on the fetcher thread; emitting it is per-block work only (no work per record): its
dead letters, its rows as one block, the split's offset moved to the block's end.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import date, datetime, timedelta
from typing import Protocol

from enumerator_service import SplitAssignment, SplitState
from spark_jobs.source._batch import ParsedBlock
from spark_jobs.source._poison import SplitFailure

__all__ = ["ReaderOutput", "RecordEmitter"]


class ReaderOutput(Protocol):
    """Where a source emits (implemented by the task). Mailbox thread only."""

    def split_added(self, assignment: SplitAssignment, state: SplitState) -> None:
        """A split starts (or restarts: ``state`` is its restored progress)."""

    def collect_block(self, block: ParsedBlock) -> None:
        """A block's rows enter the operator chain (``block.replay``: re-read on restore)."""

    def dead_letter(
        self, split_id: int, offset: int, raw: bytes, reason: str, day: date | None = None
    ) -> None:
        """A malformed record of a split (``reason``: ``"category: detail"``; ``day``: the
        day the reader gives it, see ``ParsedBlock.dead_days``)."""

    def split_finished(self, split_id: int, state: SplitState) -> None:
        """The split's last block was emitted (the split still counts for the task
        watermark during this call)."""

    def split_failed(self, failure: SplitFailure, state: SplitState) -> None:
        """Reading the split failed on its content after the blocks emitted so far (``state``:
        its progress up to there); the split is dropped from this reader."""


class RecordEmitter:
    """Emits blocks, extracts event time, tracks per-split watermarks.

    A split's watermark is its largest event time minus ``out_of_orderness`` (bounded
    out-of-orderness; a timedelta or seconds). It never moves backwards: a restored split
    starts from its committed watermark (``SplitState.watermark``) and only a later event
    time raises it. A split that emitted no record (nor a heartbeat: an event time in a
    block without rows) for ``idle_timeout`` seconds (counted from when it was added, see
    :meth:`split_added`) is idle and does not hold the task watermark back until its next
    record; before that, a split without a watermark yet holds it back (Flink's per-split
    watermark outputs start active at the minimum). A split its reader reports *behind*
    (records known to be waiting for it, :meth:`set_behind`) is never idle: a stalled fetch
    must not let the task watermark pass records not read yet, which would arrive late and
    reopen their day. Its idleness is counted from when it was last behind.
    """

    def __init__(
        self,
        *,
        out_of_orderness: timedelta | float = timedelta(seconds=5),
        idle_timeout: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not isinstance(out_of_orderness, timedelta):
            out_of_orderness = timedelta(seconds=out_of_orderness)
        self._delay = out_of_orderness
        self._idle_timeout = idle_timeout
        self._clock = clock
        self._max_event_time: dict[int, datetime] = {}
        self._last_record: dict[int, float] = {}  # split -> clock time of its last record
        self._behind: frozenset[int] = frozenset()  # splits with a known backlog

    def emit(
        self, split_id: int, block: ParsedBlock, state: SplitState, output: ReaderOutput
    ) -> None:
        """A normal block moves the split's offset to its end and records its dead letters,
        records and event times; a replay block (its range is behind the offset, its dead
        letters were recorded before the restored checkpoint) only re-enters the chain."""
        if block.replay:
            output.collect_block(block)
            return
        state.offset = block.end
        days = block.dead_days or [None] * len(block.dead)
        for (offset, raw, reason), day in zip(block.dead, days, strict=True):
            state.dead_letters += 1
            output.dead_letter(split_id, offset, raw, reason, day)
        count = block.rows.num_rows
        event_time = block.max_event_time
        state.records += count
        if count or event_time is not None:
            # A block without rows carries an event time only as a heartbeat (a CDC
            # reader's marker: every record still to come is of that time or later): the
            # split is caught up, not idle.
            self._last_record[split_id] = self._clock()
        if event_time is not None:
            latest = self._max_event_time.get(split_id)
            if latest is None or event_time > latest:
                self._max_event_time[split_id] = event_time
                mark = event_time - self._delay
                if state.watermark is None or mark > state.watermark:
                    state.watermark = mark
        output.collect_block(block)

    def split_added(self, split_id: int) -> None:
        """The split joined this reader: its idleness is counted from now."""
        self._last_record[split_id] = self._clock()

    def set_behind(self, split_ids: frozenset[int]) -> None:
        """The reader's latest word on backlogs (``RecordsWithSplitIds.behind``): exactly
        these splits have records waiting. One that stops being behind without a record
        (its backlog went otherwise: compaction, retention) is idle ``idle_timeout`` from now."""
        now = self._clock()
        for split_id in self._behind - split_ids:
            if split_id in self._last_record:
                self._last_record[split_id] = max(self._last_record[split_id], now)
        self._behind = split_ids

    def split_finished(self, split_id: int) -> None:
        self._max_event_time.pop(split_id, None)
        self._last_record.pop(split_id, None)
        self._behind = self._behind - {split_id}

    def is_idle(self, split_id: int) -> bool:
        if split_id in self._behind:
            return False
        last = self._last_record.get(split_id)
        return last is None or last <= self._clock() - self._idle_timeout
