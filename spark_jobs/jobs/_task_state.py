"""What a reader subtask checkpoints, and how it is encoded.

A subtask's state is, per split it holds: the split's progress (offset of the first record not
yet handed to the async operator, watermark — see ``SplitState``) and the operator's inputs
from that split that were not emitted yet. Together with the sink's staged output this is a
consistent cut: every record before the offset is either in the staged output, among the
pending inputs (re-invoked on restore), or a dead letter.

Threading: mailbox thread only.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from enumerator_service import SplitAssignment, SplitState
from spark_jobs.async_io import StreamRecord
from spark_jobs.source import Event

__all__ = ["TaskSplit", "decode_event", "encode_event", "event_timestamp", "snapshot_splits"]


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
    pending: dict[int, list[list[Any]]] = defaultdict(list)
    for element in operator_snapshot:
        if isinstance(element, StreamRecord):
            pending[element.value.split_id].append(encode_event(element.value))
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
