"""The fetcher thread and its bounded hand-off queue to the mailbox thread."""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future

from enumerator_service import SplitAssignment
from spark_jobs.source._format_router import SplitReader
from spark_jobs.source._records import RecordsWithSplitIds

__all__ = ["HandoffQueue", "SplitFetcher"]

_log = logging.getLogger(__name__)


class HandoffQueue:
    """Bounded queue from fetcher threads to the mailbox thread.

    ``put`` blocks while full (back-pressure on the fetcher) and wakes on ``close``. ``poll``
    never blocks; ``availability`` returns a future that completes once an item is waiting.
    """

    def __init__(self, capacity: int) -> None:
        self._items: deque[RecordsWithSplitIds | BaseException] = deque()
        self._capacity = capacity
        self._cond = threading.Condition()
        self._closed = False
        self._waiter: Future[None] | None = None

    def put(self, item: RecordsWithSplitIds | BaseException) -> bool:
        """Append ``item``; False if the queue was closed meanwhile (item dropped)."""
        with self._cond:
            while len(self._items) >= self._capacity and not self._closed:
                self._cond.wait()
            if self._closed:
                return False
            self._items.append(item)
            waiter, self._waiter = self._waiter, None
        if waiter is not None:
            waiter.set_result(None)
        return True

    def poll(self) -> RecordsWithSplitIds | BaseException | None:
        with self._cond:
            if not self._items:
                return None
            item = self._items.popleft()
            self._cond.notify()
            return item

    def availability(self) -> Future[None]:
        with self._cond:
            if self._items or self._closed:
                done: Future[None] = Future()
                done.set_result(None)
                return done
            if self._waiter is None:
                self._waiter = Future()
            return self._waiter

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()


class SplitFetcher(threading.Thread):
    """Runs the blocking side of a reader: asks for splits and fetches their blocks.

    ``request_splits`` may block (it queries the split store) and returns the next splits
    handed to this subtask, in reading order (empty: none left). It is called only when the
    split reader has run out of splits *and* the splits of the previous request are all read,
    so assignment stays lazy, idle subtasks pull more work, and a subtask never holds more
    unread splits than one request returned. The unread ones wait here, not in the split
    reader: each joins the reader (and the mailbox's per-split state and watermarks) only
    when the one before it is done, exactly as if it had been pulled on its own. They are
    held in the split store all the same (READING, this subtask, their own epoch and
    lease), so a failed attempt gives them back, or its retry reclaims them, like any other.

    Bounded (``poll_interval`` None): no split left means end of input. Continuous: the
    fetcher asks again every ``poll_interval`` seconds (splits keep arriving), and ends the
    input only after ``idle_exit`` seconds without a split (None: never; ``shutdown`` stops it).

    ``concurrent`` (a reader of stream splits, which reads all its splits at once): every
    split pulled goes to the reader at once — each request is repeated until it returns
    none, at the start and, bounded, whenever the reader has run out (then an empty answer
    ends the input); continuous, again every ``poll_interval`` seconds while it reads, so a
    partition found later joins the others without waiting for them (Flink's
    ``addSplits`` at any time).
    """

    def __init__(
        self,
        reader: SplitReader,
        handoff: HandoffQueue,
        request_splits: Callable[[], Sequence[SplitAssignment]],
        restored: list[SplitAssignment],
        *,
        name: str = "split-fetcher",
        poll_interval: float | None = None,
        idle_exit: float | None = None,
        clock: Callable[[], float] = time.monotonic,
        concurrent: bool = False,
    ) -> None:
        super().__init__(name=name, daemon=True)
        self._concurrent = concurrent
        self._reader = reader
        self._handoff = handoff
        self._request = request_splits
        # Pulled, not yet in the reader; touched by the fetcher thread only.
        self._unread: deque[SplitAssignment] = deque()
        self._restored = restored
        self._stop_event = threading.Event()
        self._poll_interval = poll_interval
        self._idle_exit = idle_exit
        self._clock = clock

    def _next_split(self) -> SplitAssignment | None:
        """The next split; None at end of input (or when shut down while waiting)."""
        if self._unread:
            return self._unread.popleft()
        idle_since = self._clock()
        while not self._stop_event.is_set():
            requested = self._request()
            if requested:
                self._unread.extend(requested[1:])
                return requested[0]
            if self._poll_interval is None:
                return None
            if self._idle_exit is not None and self._clock() - idle_since >= self._idle_exit:
                return None
            self._stop_event.wait(self._poll_interval)
        return None

    def run(self) -> None:
        try:
            added = list(self._restored)
            for assignment in added:
                self._reader.add_split(assignment)
            if self._concurrent:
                self._run_concurrent(added)
                return
            while not self._stop_event.is_set():
                if not self._reader.has_splits():
                    requested = self._next_split()
                    if requested is None:
                        self._handoff.put(RecordsWithSplitIds(end_of_input=True))
                        return
                    self._reader.add_split(requested)
                    added.append(requested)
                batch = self._reader.fetch()
                batch.added, added = added, []
                if not self._handoff.put(batch):
                    return
        except BaseException as exc:  # handed to the mailbox thread, which fails the task
            _log.debug("fetcher failed", exc_info=True)
            self._handoff.put(exc)
        finally:
            self._reader.close()

    def _pull_all(self) -> list[SplitAssignment]:
        """Every split the store hands this subtask now, each added to the reader."""
        pulled: list[SplitAssignment] = []
        while not self._stop_event.is_set():
            requested = self._request()
            if not requested:
                break
            for assignment in requested:
                self._reader.add_split(assignment)
            pulled.extend(requested)
        return pulled

    def _run_concurrent(self, added: list[SplitAssignment]) -> None:
        """The loop of a reader that reads all its splits at once (``concurrent``)."""
        continuous = self._poll_interval is not None
        idle_since = next_pull = self._clock()
        first = True
        while not self._stop_event.is_set():
            now = self._clock()
            if not continuous:
                if first or not self._reader.has_splits():
                    first = False
                    added.extend(self._pull_all())
                    if not self._reader.has_splits():
                        self._handoff.put(RecordsWithSplitIds(end_of_input=True))
                        return
            elif now >= next_pull:
                assert self._poll_interval is not None
                added.extend(self._pull_all())
                next_pull = now + self._poll_interval
            if self._reader.has_splits():
                idle_since = now
            elif continuous:
                if self._idle_exit is not None and now - idle_since >= self._idle_exit:
                    self._handoff.put(RecordsWithSplitIds(end_of_input=True))
                    return
                if not added:
                    self._stop_event.wait(max(0.0, next_pull - now))
                    continue
            if added:
                # Announced before the first fetch (which may take a while: a consumer
                # connecting): the mailbox holds the task watermark back for them from now.
                if not self._handoff.put(RecordsWithSplitIds(added=added)):
                    return
                added = []
            batch = self._reader.fetch() if self._reader.has_splits() else RecordsWithSplitIds()
            if not self._handoff.put(batch):
                return

    def shutdown(self) -> None:
        self._stop_event.set()
        self._reader.wake_up()
        self._handoff.close()
        self.join(timeout=10)
