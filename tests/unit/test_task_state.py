"""A subtask's checkpointed inputs: blocks as byte ranges, other events one entry each, in
input order, and restore turns them back into the same batches."""

from __future__ import annotations

from datetime import UTC, datetime

import pyarrow as pa

from enumerator_service import FileSplit, SplitAssignment, SplitState
from spark_jobs.async_io import StreamRecord
from spark_jobs.jobs._task_state import (
    EventBatch,
    TaskSplit,
    batch_of_events,
    decode_pending,
    snapshot_splits,
)
from spark_jobs.source import Event

WHEN = datetime(2026, 1, 1, 12, tzinfo=UTC)


def events(*ids: str) -> list[Event]:
    return [Event(3, i, n, WHEN, "click", 1.5) for n, i in enumerate(ids)]


def test_blocks_are_snapshotted_as_ranges_and_other_events_one_entry_each() -> None:
    split = FileSplit("s", "jsonl", "/f", 0, None, None)
    held = {3: TaskSplit(SplitAssignment(3, split, 1, 0), SplitState(offset=900))}
    block = EventBatch(3, batch_of_events(3, events("a", "b")).rows, (100, 400))
    loose = batch_of_events(3, events("c"))
    states = snapshot_splits(held, [StreamRecord(block), StreamRecord(loose)], 5)
    (state,) = states
    assert state["offset"] == 900
    assert state["pending"] == [
        {"span": [100, 400]},
        ["c", 0, "2026-01-01T12:00:00+00:00", "click", 1.5],
    ]


def test_restore_keeps_the_order_and_loads_ranges_lazily() -> None:
    loaded: list[tuple[int, int]] = []

    def load_span(start: int, end: int) -> pa.RecordBatch:
        loaded.append((start, end))
        rows = batch_of_events(3, events("x")).rows
        assert rows is not None
        return rows

    entries = [
        ["a", 1, "2026-01-01T12:00:00+00:00", "click", 1.0],
        ["b", 2, "2026-01-01T12:00:01+00:00", "click", 2.0],
        {"span": [10, 20]},
        ["c", 3, "2026-01-01T12:00:02+00:00", "click", 3.0],
    ]
    batches = decode_pending(3, entries, load_span)
    assert [b.span for b in batches] == [None, (10, 20), None]
    assert batches[0].rows is not None and batches[0].rows.column(0).to_pylist() == ["a", "b"]
    assert batches[1].rows is None and not loaded  # read only when the lookup needs it
    assert batches[1].loaded().column(0).to_pylist() == ["x"]
    assert loaded == [(10, 20)]
