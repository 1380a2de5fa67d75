"""The key-ordered queue of the async operator (Flink's FLIP-519, FLINK-37875).

Records with the same key leave in input order; records with different keys leave as they
complete. Like Flink's ``AsyncKeyOrderedLookupOperator`` (which runs on the async execution
controller's per-key accounting), a record whose key is in flight is *not invoked*: it waits,
un-started, until every earlier record sharing a key with it has completed, so the later
change of a row is never looked up (nor sent) before the earlier one. That is what a CDC
source needs: an update never overtakes the insert of the same row, neither in the output nor
in the calls the function makes.

An element may have several keys (a block of records, for a ``Lookup`` or a per-batch
``AsyncMap``: the distinct keys of its records); it waits for the earlier elements sharing
*any* of them, and blocks of different keys are still looked up concurrently. A waiting
element takes a slot: capacity counts every element in the queue, invoked or waiting.

Flink releases a key when the record's result has been emitted, which there is the moment it
completes. Here a completed record may be held at a watermark boundary (event-time
unordered: no record overtakes a watermark), so the key is released on completion: the next
record of the key may run meanwhile, and still leaves after it, since records of one segment
leave in completion order and segments leave in input order.

Threading: mailbox thread only, never blocks (the operator's contract).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Sequence
from typing import Any, TypeVar

from spark_jobs.async_io._elements import Marker
from spark_jobs.async_io._queues import QueueEntry, UnorderedQueue, _Segment

__all__ = ["KeyOrderedQueue"]

OUT = TypeVar("OUT")

#: The keys of an element's value: one for a record, the distinct keys of a block.
KeysOf = Callable[[Any], Iterable[Hashable]]


class KeyOrderedQueue(UnorderedQueue[OUT]):
    """Unordered across keys (never across a marker), in input order per key.

    Emission is the unordered queue's (segments between markers, completion order within a
    segment); this class adds the per-key dependencies that decide when an entry may be
    *invoked*. Each key maps to the last entry of that key in the queue (its tail); a new
    entry with a key whose tail is still incomplete waits for it (``blockers`` counts those
    tails, ``successors`` of the tail lists it). An entry waits only for the last earlier
    entry of each of its keys, which itself waited for the one before: by induction every
    earlier entry of the key has completed when it starts. Dependencies only point to
    earlier entries, so the earliest incomplete entry never waits: the queue cannot stall.

    ``_put`` returns the entry with ``blockers > 0`` when it must wait; the operator invokes
    it later, when ``on_completed`` of the last entry it waited for returns it.
    """

    def __init__(
        self,
        capacity: int,
        entry_type: type[QueueEntry[OUT]] = QueueEntry,
        *,
        keys_of: KeysOf,
    ) -> None:
        super().__init__(capacity, entry_type)
        self._keys_of = keys_of
        #: key -> the last entry of that key not completed yet.
        self._tails: dict[Hashable, QueueEntry[OUT]] = {}
        self.waiting = 0  # entries held back from invocation now (a gauge for metrics)

    def try_put_record(self, value: Any, timestamp: int | None) -> QueueEntry[OUT] | None:
        """The operator's hot path: the unordered queue's record insertion, inlined, plus the
        key bookkeeping (a call less per element: key mode's cost against unordered mode's
        is a bench target)."""
        if self._size >= self.capacity:
            return None
        self._seq += 1
        entry = self._entry_type(value, timestamp, None, self._seq)
        self._size += 1
        if self._last_is_marker:
            self._segments.append(_Segment())
            self._last_is_marker = False
        segment = self._segments[-1]
        segment.incomplete.add(entry)
        entry.segment = segment
        keys = self._keys_of(value)
        if type(keys) is not tuple:
            keys = tuple(keys)
        entry.keys = keys
        tails = self._tails
        blockers = 0
        for key in keys:
            tail = tails.get(key)
            tails[key] = entry
            if tail is not None:  # incomplete (completed tails are removed): wait for it
                if tail.successors is None:
                    tail.successors = [entry]
                else:
                    tail.successors.append(entry)
                blockers += 1
        if blockers:
            entry.blockers = blockers
            self.waiting += 1
        return entry

    def _put(
        self, value: Any, timestamp: int | None, marker: Marker | None
    ) -> QueueEntry[OUT] | None:
        if marker is None:
            return self.try_put_record(value, timestamp)
        return super()._put(value, timestamp, marker)  # markers have no key

    def on_completed(self, entry: QueueEntry[OUT]) -> Sequence[QueueEntry[OUT]]:
        """Release ``entry``'s keys; returns the entries that waited only for it any more."""
        segment = entry.segment
        assert segment is not None
        try:
            segment.incomplete.remove(entry)
        except KeyError:
            return ()  # already completed: its keys were released then
        segment.completed.append(entry)
        successors = entry.successors
        if successors is None:  # nothing waits for it: it is the tail of each of its keys
            tails = self._tails
            for key in entry.keys:
                del tails[key]
            return ()
        tails = self._tails
        for key in entry.keys:
            if tails.get(key) is entry:
                del tails[key]
        entry.successors = None
        released = []
        for successor in successors:
            successor.blockers -= 1
            if successor.blockers == 0:
                released.append(successor)
        self.waiting -= len(released)
        return released
