"""Flink's AsyncWaitOperator on the Sluice mailbox.

Threading contract: every public method runs on the mailbox thread and never blocks. Result
futures may be completed from any thread; a completion only posts a mail, and the mail (on the
mailbox thread) records the results and emits what the queue allows.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable
from typing import Any, Generic, TypeVar

from spark_jobs.async_io._elements import Marker, StreamRecord
from spark_jobs.async_io._function import AsyncFunction, ResultFuture
from spark_jobs.async_io._queues import (
    OrderedQueue,
    Output,
    QueueEntry,
    StreamElementQueue,
    UnorderedQueue,
)
from spark_jobs.runtime import MailboxExecutor, MailboxProcessor

__all__ = ["AsyncWaitOperator", "OutputMode", "QueueFullError"]

IN = TypeVar("IN")
OUT = TypeVar("OUT")


class OutputMode(enum.Enum):
    ORDERED = "ordered"
    UNORDERED = "unordered"


class QueueFullError(RuntimeError):
    """An element was offered while the operator had no free slot (check has_capacity)."""


class _Handler(ResultFuture[OUT]):
    """ResultFuture of one entry: posts the completion to the mailbox (first one wins there)."""

    __slots__ = ("_entry", "_operator")

    def __init__(self, operator: AsyncWaitOperator[Any, OUT], entry: QueueEntry[OUT]) -> None:
        self._operator = operator
        self._entry = entry

    def complete(self, results: Iterable[OUT]) -> None:
        results = list(results)
        self._operator._executor.execute(
            lambda: self._operator._on_result(self._entry, results), "async result"
        )

    def complete_exceptionally(self, error: BaseException) -> None:
        self._operator._executor.execute(
            lambda: self._operator._on_error(self._entry, error), "async failure"
        )


class AsyncWaitOperator(Generic[IN, OUT]):
    """Keeps at most ``capacity`` elements in flight and emits results in the chosen mode.

    When full, ``has_capacity()`` is False and the caller (the task's default action) suspends
    itself and registers ``notify_when_available``; it never blocks the thread.
    """

    def __init__(
        self,
        function: AsyncFunction[IN, OUT],
        output: Output[OUT],
        processor: MailboxProcessor,
        *,
        capacity: int = 100,
        mode: OutputMode = OutputMode.ORDERED,
    ) -> None:
        self._function = function
        self._output = output
        self._processor = processor
        self._executor: MailboxExecutor = processor.executor()
        queue_type = OrderedQueue if mode is OutputMode.ORDERED else UnorderedQueue
        self._queue: StreamElementQueue[OUT] = queue_type(capacity)
        self._available: list[Callable[[], None]] = []
        self._drained: list[Callable[[], None]] = []
        self._failure: BaseException | None = None
        self._finishing = False
        self.records_in = 0
        self.records_out = 0

    async def open(self) -> None:
        await self._function.open()

    async def close(self) -> None:
        self._finishing = True
        await self._function.close()

    # -- input (mailbox thread) ----------------------------------------------------------

    def has_capacity(self) -> bool:
        return self._queue.has_capacity()

    def in_flight(self) -> int:
        return len(self._queue)

    def process_element(self, value: IN, timestamp: int | None = None) -> None:
        self._check()
        entry = self._queue.try_put(StreamRecord(value, timestamp))
        if entry is None:
            raise QueueFullError("async operator is at capacity")
        self.records_in += 1
        self._function.async_invoke(value, _Handler(self, entry))

    def process_marker(self, marker: Marker) -> None:
        """Queue an in-band marker (watermark, end of split); it takes a slot like a record."""
        self._check()
        if self._queue.try_put(marker) is None:
            raise QueueFullError("async operator is at capacity")
        self._queue.emit_completed(self._output)
        self._after_emit()

    def notify_when_available(self, callback: Callable[[], None]) -> None:
        """Run ``callback`` (on the mailbox thread) once a slot is free."""
        if self._queue.has_capacity():
            callback()
        else:
            self._available.append(callback)

    def notify_when_drained(self, callback: Callable[[], None]) -> None:
        """Run ``callback`` once nothing is in flight (end of input waits for this)."""
        if self._queue.is_empty():
            callback()
        else:
            self._drained.append(callback)

    def snapshot(self) -> list[StreamRecord[Any] | Marker]:
        """Every element not yet emitted, completed or not, in input order."""
        self._check()
        return self._queue.values()

    # -- completions (mail, mailbox thread) ----------------------------------------------

    def _on_result(self, entry: QueueEntry[OUT], results: list[OUT]) -> None:
        if entry.done or self._finishing:
            return  # only the first completion counts; late results while finishing drop
        entry.results = results
        self.records_out += len(results)
        self._queue.on_completed(entry)
        self._queue.emit_completed(self._output)
        self._after_emit()

    def _on_error(self, entry: QueueEntry[OUT], error: BaseException) -> None:
        if entry.done or self._finishing:
            return
        self._failure = error
        raise error

    def _after_emit(self) -> None:
        if self._available and self._queue.has_capacity():
            callbacks, self._available = self._available, []
            for callback in callbacks:
                callback()
        if self._drained and self._queue.is_empty():
            callbacks, self._drained = self._drained, []
            for callback in callbacks:
                callback()

    def _check(self) -> None:
        if self._processor.debug:
            self._processor.check_mailbox_thread()
        if self._failure is not None:
            raise self._failure
