"""What a reader subtask checkpoints, and how it is encoded.

A subtask's state is, per split it holds: the split's progress (offset of the first record not
yet handed to the async operator, watermark — see ``SplitState``) and the operator's inputs
from that split that were not emitted yet. Together with the sink's staged output this is a
consistent cut: every record before the offset is either in the staged output, among the
pending inputs (re-invoked on restore), or a dead letter.

The operator's element is an :class:`EventBatch`, and a pending one is encoded compactly:

- a block of JSON Lines (``span`` set) as ``{"span": [start, end]}`` — its lines' byte range,
  re-read and re-parsed on restore (its dead letters were recorded when it was emitted, so
  only its events are invoked again). ``end`` is at most the split's offset: a block's
  ``end`` becomes the split's offset when it is emitted (see ``JsonBlockSplitReader``);
- events of other formats (no span: read record by record, or restored from such entries)
  as one ``[event_id, user_id, event_time, event_type, amount]`` entry per event, the
  encoding of checkpoints taken before batches existed, which restore still reads.

Threading: mailbox thread only (``EventBatch.load`` runs on an executor thread).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import pyarrow as pa

from enumerator_service import SplitAssignment, SplitState
from spark_jobs.async_io import StreamRecord
from spark_jobs.source import Event, events_to_batch

__all__ = [
    "EventBatch",
    "TaskSplit",
    "batch_of_events",
    "decode_event",
    "decode_pending",
    "encode_event",
    "event_timestamp",
    "snapshot_splits",
]


@dataclass(slots=True)
class EventBatch:
    """The async operator's element: events of one split, in input order.

    ``rows`` (``EVENT_SCHEMA``) is None until ``load`` read them (a block restored as its
    byte range ``span``); ``span`` is set for blocks of JSON Lines, whose range is what a
    checkpoint stores.
    """

    split_id: int
    rows: pa.RecordBatch | None
    span: tuple[int, int] | None = None
    load: Callable[[], pa.RecordBatch] | None = None

    def loaded(self) -> pa.RecordBatch:
        """Executor thread (via the lookup): the rows, reading the span if needed."""
        if self.rows is not None:
            return self.rows
        assert self.load is not None, "a batch without rows has a loader"
        return self.load()


def batch_of_events(split_id: int, events: list[Event]) -> EventBatch:
    batch, unfit = events_to_batch(events)
    if unfit:  # as before batches: such a key or time fails the task (the query did)
        raise ValueError(f"event {events[unfit[0]].event_id!r}: user_id or time out of range")
    return EventBatch(split_id, batch)


def decode_pending(
    split_id: int,
    entries: Iterable[Any],
    load_span: Callable[[int, int], pa.RecordBatch],
) -> list[EventBatch]:
    """The pending inputs of a restored split as batches, in their order."""
    out: list[EventBatch] = []
    events: list[Event] = []
    for entry in entries:
        if isinstance(entry, dict):
            if events:
                out.append(batch_of_events(split_id, events))
                events = []
            start, end = entry["span"]
            out.append(EventBatch(split_id, None, (start, end), _loader(load_span, start, end)))
        else:
            events.append(decode_event(split_id, entry))
    if events:
        out.append(batch_of_events(split_id, events))
    return out


def _loader(
    load_span: Callable[[int, int], pa.RecordBatch], start: int, end: int
) -> Callable[[], pa.RecordBatch]:
    return lambda: load_span(start, end)


def _encode_batch(batch: EventBatch) -> list[Any]:
    if batch.span is not None:
        return [{"span": list(batch.span)}]
    rows = batch.loaded().to_pylist()
    return [
        [r["event_id"], r["user_id"], r["event_time"].isoformat(), r["event_type"], r["amount"]]
        for r in rows
    ]


@dataclass(slots=True)
class TaskSplit:
    """A split this attempt holds: its assignment, its live state (shared with the reader),
    and the checkpoint whose snapshot last recorded it as finished."""

    assignment: SplitAssignment
    state: SplitState
    reading_done: bool = False
    finished_in: int | None = None


def encode_event(event: Event) -> list[Any]:
    """JSON form of an in-flight operator input (the split id is implied by the split)."""
    return [
        event.event_id,
        event.user_id,
        event.event_time.isoformat(),
        event.event_type,
        event.amount,
    ]


def decode_event(split_id: int, encoded: list[Any]) -> Event:
    event_id, user_id, when, event_type, amount = encoded
    return Event(split_id, event_id, user_id, datetime.fromisoformat(when), event_type, amount)


def event_timestamp(event: Event) -> int:
    """The record timestamp (epoch milliseconds) the operator carries with an event."""
    return int(event.event_time.timestamp() * 1000)


def snapshot_splits(
    splits: Mapping[int, TaskSplit], operator_snapshot: Iterable[object], checkpoint_id: int
) -> list[dict[str, Any]]:
    """The split states of checkpoint ``checkpoint_id``: offsets, watermarks and the
    operator's not-yet-emitted inputs of each split, in input order.

    A split that is read to its end with nothing pending is marked finished in this
    checkpoint: once it completes, the split is no longer this subtask's state.
    """
    pending: dict[int, list[Any]] = defaultdict(list)
    for element in operator_snapshot:
        if isinstance(element, StreamRecord):
            batch: EventBatch = element.value
            pending[batch.split_id].extend(_encode_batch(batch))
    states = []
    for split_id, held in splits.items():
        state = held.state
        waiting = pending.get(split_id, [])
        states.append(
            {
                "id": split_id,
                "epoch": held.assignment.epoch,
                "offset": state.offset,
                "watermark": state.watermark.isoformat() if state.watermark else None,
                "finished": held.reading_done,
                "pending": waiting,
            }
        )
        if held.reading_done and not waiting and held.finished_in is None:
            # The first checkpoint that carries the final state: once it completes (or any
            # later one), the split is forgotten.
            held.finished_in = checkpoint_id
    return states
