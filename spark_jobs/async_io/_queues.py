"""In-flight element queues of the async operator (Flink's StreamElementQueue).

One interface, three implementations: ``OrderedQueue`` and ``UnorderedQueue`` here,
``KeyOrderedQueue`` (per-key order, FLIP-519) in ``_key_queue``. All methods run on the
mailbox thread and never block.
"""

from __future__ import annotations

import abc
from collections import deque
from collections.abc import Callable, Hashable, Sequence
from typing import Any, Generic, TypeVar

from spark_jobs.async_io._elements import Marker, StreamRecord

__all__ = ["OrderedQueue", "QueueEntry", "StreamElementQueue", "UnorderedQueue"]

OUT = TypeVar("OUT")
Element = StreamRecord[Any] | Marker


class QueueEntry(Generic[OUT]):
    """One element in flight. Records complete later; markers are complete on insertion.

    A record's value and timestamp live on the entry itself (its StreamRecord is built only for
    snapshots): with hundreds of elements in flight, every object per element counts against
    CPython's young-generation GC threshold.
    """

    __slots__ = (
        "attempt",
        "blockers",
        "error",
        "keys",
        "marker",
        "pending",
        "results",
        "retry_timer",
        "segment",
        "seq",
        "successors",
        "timed_out",
        "timestamp",
        "value",
    )

    def __init__(
        self, value: Any, timestamp: int | None, marker: Marker | None = None, seq: int = 0
    ) -> None:
        self.value = value
        self.timestamp = timestamp
        self.marker = marker
        self.seq = seq
        self.results: list[OUT] | None = None if marker is None else []
        self.segment: _Segment[OUT] | None = None
        # Bookkeeping of the operator (completions not yet processed, retries, timeouts).
        self.pending: list[OUT] | None = None
        self.error: BaseException | None = None
        self.attempt = 0
        self.retry_timer: Any = None
        self.timed_out = False
        # Key-ordered mode (``KeyOrderedQueue``): the element's keys, how many earlier
        # elements sharing a key it still waits for (0: it may be invoked), and the elements
        # waiting for it.
        self.keys: tuple[Hashable, ...] = ()
        self.blockers = 0
        self.successors: list[QueueEntry[OUT]] | None = None

    @property
    def done(self) -> bool:
        return self.results is not None

    @property
    def element(self) -> Element:
        marker = self.marker
        return StreamRecord(self.value, self.timestamp) if marker is None else marker


class Output(Generic[OUT]):
    """Where emitted results and markers go (the next operator).

    ``flush``, if given, is called after each run of emissions (every element that could
    leave has left): a consumer that buffers results (to re-batch them) passes them on then.
    """

    def __init__(
        self,
        collect: Callable[[OUT, int | None], None],
        marker: Callable[[Marker], None],
        flush: Callable[[], None] | None = None,
    ) -> None:
        self.collect = collect
        self.emit_marker = marker
        self.flush = flush


class StreamElementQueue(abc.ABC, Generic[OUT]):
    def __init__(self, capacity: int, entry_type: type[QueueEntry[OUT]] = QueueEntry) -> None:
        if capacity < 1:
            raise ValueError("capacity must be >= 1")
        self.capacity = capacity
        self._size = 0
        self._entry_type = entry_type

    def __len__(self) -> int:
        return self._size

    def is_empty(self) -> bool:
        return self._size == 0

    def has_capacity(self) -> bool:
        return self._size < self.capacity

    def try_put(self, element: Element) -> QueueEntry[OUT] | None:
        """Add ``element``; returns its entry, or None when the queue is full."""
        if isinstance(element, StreamRecord):
            return self.try_put_record(element.value, element.timestamp)
        return self._put(None, None, element)

    def try_put_record(self, value: Any, timestamp: int | None) -> QueueEntry[OUT] | None:
        """Add a record without building its StreamRecord (the operator's hot path)."""
        return self._put(value, timestamp, None)

    @abc.abstractmethod
    def _put(
        self, value: Any, timestamp: int | None, marker: Marker | None
    ) -> QueueEntry[OUT] | None:
        """Add a record (``marker`` None) or a marker; None when full."""

    @abc.abstractmethod
    def on_completed(self, entry: QueueEntry[OUT]) -> Sequence[QueueEntry[OUT]]:
        """Tell the queue that ``entry`` (already holding its results) completed.

        Returns the entries that may be invoked now, in input order: entries that waited for
        ``entry`` (key-ordered mode; the others never hold an entry back from invocation)."""

    @abc.abstractmethod
    def emit_completed(self, output: Output[OUT]) -> int:
        """Emit every element that may leave now; returns how many left."""

    @abc.abstractmethod
    def values(self) -> list[Element]:
        """Every element not yet emitted, in input order (for snapshots)."""


def _emit(entry: QueueEntry[OUT], output: Output[OUT]) -> None:
    marker = entry.marker
    if marker is None:
        assert entry.results is not None
        timestamp = entry.timestamp
        for result in entry.results:
            output.collect(result, timestamp)
    else:
        output.emit_marker(marker)


class OrderedQueue(StreamElementQueue[OUT]):
    """Emits in input order: an element leaves only when it and all before it completed."""

    def __init__(self, capacity: int, entry_type: type[QueueEntry[OUT]] = QueueEntry) -> None:
        super().__init__(capacity, entry_type)
        self._entries: deque[QueueEntry[OUT]] = deque()

    def _put(
        self, value: Any, timestamp: int | None, marker: Marker | None
    ) -> QueueEntry[OUT] | None:
        if self._size >= self.capacity:
            return None
        entry = self._entry_type(value, timestamp, marker)
        self._entries.append(entry)
        self._size += 1
        return entry

    def on_completed(self, entry: QueueEntry[OUT]) -> Sequence[QueueEntry[OUT]]:
        """Nothing to move: the head check in ``emit_completed`` does the work."""
        return ()

    def emit_completed(self, output: Output[OUT]) -> int:
        entries = self._entries
        emitted = 0
        while entries and entries[0].done:
            _emit(entries.popleft(), output)
            emitted += 1
        self._size -= emitted
        return emitted

    def values(self) -> list[Element]:
        return [e.element for e in self._entries]


class _Segment(Generic[OUT]):
    """Records between two markers (or one marker alone): free to overtake each other."""

    __slots__ = ("completed", "incomplete")

    def __init__(self) -> None:
        self.incomplete: set[QueueEntry[OUT]] = set()
        self.completed: deque[QueueEntry[OUT]] = deque()


class UnorderedQueue(StreamElementQueue[OUT]):
    """Completed records leave as soon as they complete, but never across a marker.

    Without markers (processing time) this is fully unordered. With watermarks (event time) each
    marker is a boundary: no record overtakes a watermark and no watermark overtakes a record.
    """

    def __init__(self, capacity: int, entry_type: type[QueueEntry[OUT]] = QueueEntry) -> None:
        super().__init__(capacity, entry_type)
        self._segments: deque[_Segment[OUT]] = deque()
        self._last_is_marker = True
        self._seq = 0

    def _put(
        self, value: Any, timestamp: int | None, marker: Marker | None
    ) -> QueueEntry[OUT] | None:
        if self._size >= self.capacity:
            return None
        self._seq += 1
        entry = self._entry_type(value, timestamp, marker, self._seq)
        self._size += 1
        if entry.results is None:  # a record: joins the open segment
            if self._last_is_marker:
                self._segments.append(_Segment())
                self._last_is_marker = False
            segment = self._segments[-1]
            segment.incomplete.add(entry)
        else:  # a marker: a segment of its own, complete at once
            segment = _Segment()
            self._segments.append(segment)
            segment.completed.append(entry)
            self._last_is_marker = True
        entry.segment = segment
        return entry

    def on_completed(self, entry: QueueEntry[OUT]) -> Sequence[QueueEntry[OUT]]:
        self._move_to_completed(entry)
        return ()

    def _move_to_completed(self, entry: QueueEntry[OUT]) -> bool:
        """Move ``entry`` to its segment's completed ones; False if it was there already."""
        segment = entry.segment
        assert segment is not None
        try:
            segment.incomplete.remove(entry)
        except KeyError:
            return False  # already completed
        segment.completed.append(entry)
        return True

    def emit_completed(self, output: Output[OUT]) -> int:
        emitted = 0
        segments = self._segments
        while segments:
            head = segments[0]
            while head.completed:
                entry = head.completed.popleft()
                _emit(entry, output)
                emitted += 1
            if not head.incomplete and (len(segments) > 1 or self._last_is_marker):
                segments.popleft()
                continue
            break
        self._size -= emitted
        return emitted

    def values(self) -> list[Element]:
        entries = [e for s in self._segments for e in (*s.incomplete, *s.completed)]
        return [e.element for e in sorted(entries, key=lambda e: e.seq)]
