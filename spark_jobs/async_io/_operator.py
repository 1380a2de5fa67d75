"""Flink's AsyncWaitOperator on the Sluice mailbox.

Threading contract: every public method runs on the mailbox thread and never blocks. Result
futures may be completed from any thread. A completion never touches operator state directly:
from a foreign thread it posts one mail; on the mailbox thread (asyncio callbacks) it is queued
and one mail drains all completions queued meanwhile, so a batch of lookups costs one mail.

Back-pressure: at most ``capacity`` elements are in flight (KEY mode: waiting ones included).
Elements offered beyond that wait in a backlog, un-invoked, and ``has_capacity()`` turns
False so the task's default action suspends itself until ``notify_when_available`` fires;
nothing ever blocks the thread.
"""

from __future__ import annotations

import contextlib
import enum
from collections import deque
from collections.abc import Callable, Hashable, Iterable, Sequence
from threading import get_ident
from typing import Any, Generic, TypeVar

from spark_jobs.async_io._deadlines import Deadlines
from spark_jobs.async_io._elements import Marker, StreamRecord
from spark_jobs.async_io._function import AsyncFunction
from spark_jobs.async_io._key_queue import KeyOrderedQueue
from spark_jobs.async_io._queues import (
    OrderedQueue,
    Output,
    QueueEntry,
    StreamElementQueue,
    UnorderedQueue,
)
from spark_jobs.async_io._result_futures import _Attempt, _Entry
from spark_jobs.async_io._retry import NO_RETRY, AsyncRetryStrategy
from spark_jobs.runtime import MailboxClosedError, MailboxProcessor
from spark_jobs.runtime._timers import AsyncioTimerService, TimerService

__all__ = ["AsyncWaitOperator", "OutputMode"]

IN = TypeVar("IN")
OUT = TypeVar("OUT")
Element = StreamRecord[Any] | Marker


class OutputMode(enum.Enum):
    ORDERED = "ordered"
    UNORDERED = "unordered"
    KEY = "key"


class AsyncWaitOperator(Generic[IN, OUT]):
    """Runs an AsyncFunction per element; emits in input order (ORDERED), as completed but
    never across a marker (UNORDERED), or in input order per key and as completed across keys
    (KEY, with ``key`` giving an element's keys; see ``KeyOrderedQueue``: an element is
    invoked only once every earlier element sharing a key with it has completed, and its
    ``timeout`` runs from that invocation).

    ``timeout`` (seconds) bounds each element across all its attempts; on expiry the function's
    ``timeout()`` decides the outcome. ``retry`` needs a timeout. A failed element (exception,
    retries exhausted, or the default ``timeout()``) fails the task at once, as Flink's
    operator does: the failure is raised from the mail that delivered it, the element is never
    completed nor emitted (it stays in the queue, so a snapshot still holds it and a restore
    re-invokes it), and the operator refuses input and snapshots from then on. An error is
    never turned into "no result" that a checkpoint could commit past.
    """

    def __init__(
        self,
        function: AsyncFunction[IN, OUT],
        output: Output[OUT],
        processor: MailboxProcessor,
        *,
        capacity: int = 100,
        mode: OutputMode = OutputMode.ORDERED,
        key: Callable[[Any], Iterable[Hashable]] | None = None,
        timeout: float | None = None,
        retry: AsyncRetryStrategy = NO_RETRY,
        timer_service: TimerService | None = None,
    ) -> None:
        if retry.enabled and not (timeout and timeout > 0):
            raise ValueError("a retry strategy needs a timeout > 0 (it spans all attempts)")
        if (key is None) == (mode is OutputMode.KEY):
            raise ValueError("key is required with mode KEY and refused with the other modes")
        self._function = function
        self._output = output
        self._processor = processor
        self._executor = processor.executor()
        entry_type: type[_Entry[OUT]] = type(
            "BoundEntry", (_Entry,), {"__slots__": (), "operator": self}
        )
        self._queue: StreamElementQueue[OUT] = (
            KeyOrderedQueue(capacity, entry_type, keys_of=key)
            if key is not None
            else (OrderedQueue if mode is OutputMode.ORDERED else UnorderedQueue)(
                capacity, entry_type
            )
        )
        self._backlog: deque[Element] = deque()
        self._timeout = timeout if timeout and timeout > 0 else None
        self._retry = retry
        self._retry_enabled = retry.enabled
        self._timers = timer_service or AsyncioTimerService(self._executor)
        # Timeouts: one timer for the earliest deadline.
        self._deadlines = Deadlines(self._timers, self._timeout or 0.0, self._expire)
        self._retrying: set[QueueEntry[OUT]] = set()  # entries waiting for a retry timer
        self._completions: list[
            tuple[QueueEntry[OUT], int, list[OUT] | None, BaseException | None]
        ] = []
        self._own_completions: list[_Entry[OUT]] = []
        self._drain_posted = False
        self._available: list[Callable[[], None]] = []
        self._drained: list[Callable[[], None]] = []
        self._failure: BaseException | None = None
        self._finishing = False
        self.records_in = 0
        self.records_out = 0
        self.retries = 0
        self.timeouts = 0

    async def open(self) -> None:
        await self._function.open()

    async def close(self) -> None:
        """Stop: late results are dropped from now on, timers cancelled, function closed."""
        self._finishing = True
        self._deadlines.cancel()
        for entry in self._retrying:
            if entry.retry_timer is not None:
                entry.retry_timer.cancel()
                entry.retry_timer = None
        self._retrying.clear()
        await self._function.close()

    # -- input (mailbox thread) ----------------------------------------------------------

    def has_capacity(self) -> bool:
        """True while new input can be invoked at once (no backlog, a free slot, no failure)."""
        return self._failure is None and not self._backlog and self._queue.has_capacity()

    def in_flight(self) -> int:
        """Elements invoked or queued and not yet emitted, backlog included."""
        return len(self._queue) + len(self._backlog)

    def pending_timers(self) -> int:
        return self._timers.pending()

    def process_element(self, value: IN, timestamp: int | None = None) -> None:
        if self._failure is not None or self._processor.debug:
            self._check()
        if self._backlog or not self._queue.has_capacity():
            self._backlog.append(StreamRecord(value, timestamp))
            return
        # _invoke and _start, inlined: this runs once per element.
        entry = self._queue.try_put_record(value, timestamp)
        assert entry is not None
        self.records_in += 1
        if entry.blockers:
            return  # KEY mode: waits for an earlier element of its key (see _complete)
        if self._timeout is not None:
            self._deadlines.add(entry)
        # Retries need a fresh future per attempt, so that a superseded attempt is ignored.
        self._function.async_invoke(
            value,
            _Attempt(self, entry, 0) if self._retry_enabled else entry,  # type: ignore[arg-type]
        )

    def process_marker(self, marker: Marker) -> None:
        """Queue an in-band marker (watermark, end of split); it takes a slot like a record."""
        self._check()
        if self._backlog or not self._queue.has_capacity():
            self._backlog.append(marker)
            return
        self._queue.try_put(marker)
        self._emit()

    def restore(self, elements: Sequence[Element]) -> None:
        """Re-invoke the elements of a snapshot, in order (their results were never emitted)."""
        for element in elements:
            if isinstance(element, StreamRecord):
                self.process_element(element.value, element.timestamp)
            else:
                self.process_marker(element)

    def notify_when_available(self, callback: Callable[[], None]) -> None:
        """Run ``callback`` (on the mailbox thread) once input can be invoked again."""
        if self.has_capacity():
            callback()
        else:
            self._available.append(callback)

    def notify_when_drained(self, callback: Callable[[], None]) -> None:
        """Run ``callback`` once nothing is in flight (end of input waits for this)."""
        if self.in_flight() == 0:
            callback()
        else:
            self._drained.append(callback)

    def snapshot(self) -> list[Element]:
        """Every element not yet emitted, completed or not, backlog included, in input order.

        Raises the failure of a failed operator: a failed task never acknowledges a snapshot."""
        self._check()
        return [*self._queue.values(), *self._backlog]

    # -- internals (mailbox thread) ------------------------------------------------------

    def _invoke(self, value: Any, timestamp: int | None) -> None:
        entry = self._queue.try_put_record(value, timestamp)
        assert entry is not None
        self.records_in += 1
        if not entry.blockers:
            self._start(entry)

    def _start(self, entry: QueueEntry[OUT]) -> None:
        """Invoke the function for a queued entry; its timeout runs from now (monotonic)."""
        if self._timeout is not None:
            self._deadlines.add(entry)
        self._function.async_invoke(
            entry.value,
            _Attempt(self, entry, 0) if self._retry_enabled else entry,  # type: ignore[arg-type]
        )

    def _deliver(
        self,
        entry: QueueEntry[OUT],
        attempt: int,
        results: list[OUT] | None,
        error: BaseException | None,
    ) -> None:
        """Called by result futures from any thread: hand the completion to the mailbox."""
        if self._finishing:
            return  # the task is finishing: late results are dropped, never raised
        try:
            if get_ident() == self._processor.mailbox.mailbox_thread:
                self._completions.append((entry, attempt, results, error))
                if not self._drain_posted:
                    self._drain_posted = True
                    self._executor.execute(self._drain_completions, "async results")
            else:
                self._executor.execute(
                    lambda: self._complete_and_emit(entry, attempt, results, error),
                    "async result",
                )
        except MailboxClosedError:
            pass  # the task already ended: nobody is left to take the result

    def _deliver_own(
        self, entry: _Entry[OUT], results: list[OUT] | None, error: BaseException | None
    ) -> None:
        """Completion of an entry that is its own future (no retries): no tuple per element."""
        if self._finishing or entry.pending is not None or entry.error is not None:
            return  # finishing, or not the first completion
        if get_ident() != self._processor.mailbox.mailbox_thread:
            self._deliver(entry, 0, results, error)  # a foreign thread: one mail each
            return
        entry.pending, entry.error = results, error
        self._own_completions.append(entry)
        if not self._drain_posted:
            self._drain_posted = True
            with contextlib.suppress(MailboxClosedError):
                self._executor.execute(self._drain_completions, "async results")

    def _drain_completions(self) -> None:
        self._drain_posted = False
        progressed = False
        if self._own_completions:
            own, self._own_completions = self._own_completions, []
            for entry in own:
                progressed |= self._complete(entry, 0, entry.pending, entry.error)
        if self._completions:
            batch, self._completions = self._completions, []
            for queued, attempt, results, error in batch:
                progressed |= self._complete(queued, attempt, results, error)
        if progressed:
            self._emit()

    def _complete_and_emit(
        self,
        entry: QueueEntry[OUT],
        attempt: int,
        results: list[OUT] | None,
        error: BaseException | None,
    ) -> None:
        if self._complete(entry, attempt, results, error):
            self._emit()

    def _complete(
        self,
        entry: QueueEntry[OUT],
        attempt: int,
        results: list[OUT] | None,
        error: BaseException | None,
    ) -> bool:
        """Record one completion; False when it was dropped or turned into a retry."""
        if entry.results is not None or self._finishing or attempt != entry.attempt:
            return False  # only the first completion of the current attempt counts
        retry = self._retry
        if self._retry_enabled and not entry.timed_out and retry.can_retry(entry.attempt):
            if error is None:
                assert results is not None
                wants_retry = retry.on_result is not None and retry.on_result(results)
            else:
                wants_retry = retry.on_exception is not None and retry.on_exception(error)
            if wants_retry:
                self._schedule_retry(entry)
                return False
        if error is not None:
            # Fail now (inside a mail: this fails the task). The entry stays uncompleted in
            # the queue: whatever snapshot could still be taken holds its input, so recovery
            # re-invokes it; completing it empty would let a checkpoint commit past it.
            if self._failure is None:
                self._failure = error
            raise self._failure
        assert results is not None
        entry.results = results
        self.records_out += len(results)
        if entry.retry_timer is not None:
            entry.retry_timer.cancel()
            entry.retry_timer = None
            self._retrying.discard(entry)
        for released in self._queue.on_completed(entry):
            self._start(released)  # KEY mode: the next element of a key may run now
        return True

    def _schedule_retry(self, entry: QueueEntry[OUT]) -> None:
        entry.attempt += 1
        self.retries += 1
        when = self._timers.now() + self._retry.backoff(entry.attempt)
        entry.retry_timer = self._timers.register(when, lambda: self._reinvoke(entry))
        self._retrying.add(entry)

    def _reinvoke(self, entry: QueueEntry[OUT]) -> None:
        entry.retry_timer = None
        self._retrying.discard(entry)
        if entry.done or self._finishing or entry.timed_out:
            return
        self._function.async_invoke(entry.value, _Attempt(self, entry, entry.attempt))

    def _expire(self, entry: QueueEntry[OUT]) -> None:
        """``entry`` reached its deadline (called by ``Deadlines``)."""
        if self._finishing:
            return
        entry.timed_out = True
        self.timeouts += 1
        if entry.retry_timer is not None:
            entry.retry_timer.cancel()
            entry.retry_timer = None
            self._retrying.discard(entry)
        self._function.timeout(entry.value, _Attempt(self, entry, entry.attempt))

    # -- emission ------------------------------------------------------------------------

    def _emit(self) -> None:
        queue, backlog, output = self._queue, self._backlog, self._output
        emitted = queue.emit_completed(output)
        while backlog and queue.has_capacity() and self._failure is None:
            element = backlog.popleft()
            if isinstance(element, StreamRecord):
                self._invoke(element.value, element.timestamp)
            else:
                queue.try_put(element)
                emitted += queue.emit_completed(output)
        if emitted and output.flush is not None:
            output.flush()
        if queue.is_empty():
            self._deadlines.cancel()  # nothing can time out any more: no timer stays behind
        if self._available and self.has_capacity():
            callbacks, self._available = self._available, []
            for callback in callbacks:
                callback()
        if self._drained and self.in_flight() == 0:
            callbacks, self._drained = self._drained, []
            for callback in callbacks:
                callback()

    def _check_thread(self) -> None:
        if self._processor.debug:
            self._processor.check_mailbox_thread()

    def _check(self) -> None:
        self._check_thread()
        if self._failure is not None:
            raise self._failure
