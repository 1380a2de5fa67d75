"""SourceReaderBase: the non-blocking, mailbox-thread side of a FLIP-27 source."""

from __future__ import annotations

import enum
from collections import deque
from concurrent.futures import Future
from datetime import datetime

from enumerator_service import SplitState
from spark_jobs.source._batch import ParsedBlock
from spark_jobs.source._emitter import ReaderOutput, RecordEmitter
from spark_jobs.source._fetcher import HandoffQueue, SplitFetcher
from spark_jobs.source._poison import SplitFailure

__all__ = ["InputStatus", "SourceReaderBase"]


class InputStatus(enum.Enum):
    MORE_AVAILABLE = "more"
    NOTHING_AVAILABLE = "nothing"
    END_OF_INPUT = "end"


class SourceReaderBase:
    """Emits at most one block per ``poll_next`` call. Mailbox thread only; never blocks.

    Fetch results come from the fetcher thread through the bounded hand-off queue; when it is
    empty, ``poll_next`` returns NOTHING_AVAILABLE and ``is_available()`` is a future that
    completes when the next one arrives. Split states live here and are updated by the
    RecordEmitter. A split's blocks are emitted before it is reported finished (or failed).
    """

    def __init__(self, fetcher: SplitFetcher, handoff: HandoffQueue, emitter: RecordEmitter):
        self._fetcher = fetcher
        self._handoff = handoff
        self._emitter = emitter
        self._states: dict[int, SplitState] = {}
        self._blocks: deque[ParsedBlock] = deque()
        self._finished: deque[int] = deque()
        self._failed: deque[SplitFailure] = deque()
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
        """The task watermark: the minimum over the active (non-idle) splits' watermarks.

        None while an active split has no watermark yet (it holds the others back), or when
        no split is active. Not monotonic by itself (a split joining with an older watermark
        lowers it): the task emits a marker only when this exceeds the last one it emitted.
        """
        marks = []
        for split_id, state in self._states.items():
            if self._emitter.is_idle(split_id):
                continue
            if state.watermark is None:
                return None
            marks.append(state.watermark)
        return min(marks) if marks else None

    def is_idle(self) -> bool:
        """No split is active: none held (waiting for splits), or every one idle. Such a task
        does not hold the run's watermark back (Flink's idle watermark status)."""
        return all(self._emitter.is_idle(split_id) for split_id in self._states)

    def idle_splits(self) -> list[int]:
        return sorted(s for s in self._states if self._emitter.is_idle(s))

    def poll_next(self, output: ReaderOutput) -> InputStatus:
        while True:
            if self._blocks:
                block = self._blocks.popleft()
                split_id = block.split_id
                self._emitter.emit(split_id, block, self._states[split_id], output)
                return InputStatus.MORE_AVAILABLE
            if self._finished:
                split_id = self._finished.popleft()
                # Reported while the split still counts for ``watermark()``: its last
                # advance can still be emitted.
                output.split_finished(split_id, self._states[split_id])
                del self._states[split_id]
                self._emitter.split_finished(split_id)
                return InputStatus.MORE_AVAILABLE
            if self._failed:
                failure = self._failed.popleft()
                output.split_failed(failure, self._states.pop(failure.split_id))
                self._emitter.split_finished(failure.split_id)
                return InputStatus.MORE_AVAILABLE
            if self._end_of_input:
                return InputStatus.END_OF_INPUT
            item = self._handoff.poll()
            if item is None:
                return InputStatus.NOTHING_AVAILABLE
            if isinstance(item, BaseException):
                raise item
            if item.behind is not None:
                self._emitter.set_behind(item.behind)
            for assignment in item.added:
                state = assignment.initial_state()
                self._states[assignment.split_id] = state
                self._emitter.split_added(assignment.split_id)
                output.split_added(assignment, state)
            self._blocks.extend(item.blocks)
            self._finished.extend(item.finished)
            self._failed.extend(item.failed)
            self._end_of_input = item.end_of_input
