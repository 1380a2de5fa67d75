"""Schemas and helpers shared by the source tests (not a test module).

- ``EVENTS``: the clickstream schema the source package used to know (all fields required).
- ``ORDERS``: a composite key (``region``, ``order_no``), decimals, dates, bools, float32,
  binary, a naive timestamp, optional fields, and ``placed_at`` as event time.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import pyarrow as pa

from enumerator_service import FileSplit, SplitAssignment
from spark_jobs.source import OFFSET, BlockReader, ParsedBlock, RecordSchema, SplitRead

EVENT_FIELDS = ("event_id", "user_id", "event_time", "event_type", "amount")
EVENTS = RecordSchema(
    (
        pa.field("event_id", pa.string()),
        pa.field("user_id", pa.int64()),
        pa.field("event_time", pa.timestamp("us", tz="UTC")),
        pa.field("event_type", pa.string()),
        pa.field("amount", pa.float64()),
    ),
    frozenset(EVENT_FIELDS),
    "event_time",
)
ORDERS = RecordSchema(
    (
        pa.field("region", pa.string()),
        pa.field("order_no", pa.int32()),
        pa.field("placed_at", pa.timestamp("us", tz="UTC")),
        pa.field("placed_on", pa.date32()),
        pa.field("total", pa.decimal128(10, 2)),
        pa.field("paid", pa.bool_()),
        pa.field("weight", pa.float32()),
        pa.field("note", pa.string()),
        pa.field("shipped", pa.timestamp("us")),
        pa.field("tag", pa.binary()),
        pa.field("qty", pa.int8()),
    ),
    frozenset({"region", "order_no", "placed_at", "total"}),
    "placed_at",
)


def file_assignment(
    split_id: int,
    path: str,
    start: int,
    end: int | None,
    resume: int | None = None,
    *,
    kind: str = "jsonl",
    pending: tuple[Any, ...] = (),
) -> SplitAssignment:
    split = FileSplit("s", kind, path, start, end, None)
    return SplitAssignment(split_id, split, 1, start if resume is None else resume, pending)


def read_blocks(reader: BlockReader, read: SplitRead, budget: int = 100_000) -> list[ParsedBlock]:
    """Every block of one read; checks the read finishes."""
    reader.open(read)
    blocks: list[ParsedBlock] = []
    try:
        while True:
            budget -= 1
            assert budget > 0, "reader makes no progress"
            block, done = reader.fetch()
            if block is not None:
                blocks.append(block)
            if done:
                return blocks
    finally:
        reader.close()


def rows_of(blocks: Iterable[ParsedBlock]) -> list[dict[str, Any]]:
    """The rows of blocks, offsets included, in order."""
    return [row for block in blocks for row in block.rows.to_pylist()]


def dead_of(blocks: Iterable[ParsedBlock]) -> list[tuple[int, bytes, str]]:
    return [entry for block in blocks for entry in block.dead]


def offsets_of(blocks: Iterable[ParsedBlock]) -> list[int]:
    return [offset for block in blocks for offset in block.rows.column(OFFSET).to_pylist()]
