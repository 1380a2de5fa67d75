"""What flows through a task: parsed blocks from the readers, batches through the operators.

Every record carries its source offset in the hidden column :data:`OFFSET` (the last column
of every batch): a line's first byte, a Parquet row index, a table key. Steps use it to
name a dead letter (split, offset) and to re-read one record after a restore; user code
(``Map``, ``Filter``, ``AsyncMap``) never sees it.

Threading: plain values. A block is built on the fetcher thread and handed over whole; a
batch belongs to the mailbox thread from then on.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import date, datetime

import pyarrow as pa

from spark_jobs.pipeline._errors import RESERVED_PREFIX

__all__ = [
    "OFFSET",
    "Batch",
    "DeadLetter",
    "ParsedBlock",
    "RecordSchema",
    "user_rows",
    "with_offsets",
]

#: The hidden source-offset column (int64), always last.
OFFSET = f"{RESERVED_PREFIX}_offset"

#: A rejected record: (offset in its split, raw bytes — at most 4 KiB are kept, reason).
DeadLetter = tuple[int, bytes, str]


@dataclass(frozen=True, slots=True)
class RecordSchema:
    """What a source emits: declared fields (Arrow types, all nullable), the ones that must
    not be null, and the event-time field."""

    fields: tuple[pa.Field, ...]
    required: frozenset[str] = frozenset()
    event_time: str | None = None

    @property
    def arrow(self) -> pa.Schema:
        """The declared fields."""
        return pa.schema(self.fields)

    @property
    def batch_schema(self) -> pa.Schema:
        """The declared fields plus the offset column: the schema of every block's rows."""
        return pa.schema([*self.fields, pa.field(OFFSET, pa.int64(), nullable=False)])


@dataclass(slots=True)
class ParsedBlock:
    """Records ``[start, end)`` of split ``split_id`` (offsets in the split's offset space:
    bytes, decompressed bytes, row indices or keys), parsed and validated.

    ``rows``: the well-formed records in input order (``RecordSchema.batch_schema``);
    ``dead``: the malformed ones in offset order; ``end``: the split's offset once the block
    is emitted. ``replay``: the block re-reads a range that was in flight at the restored
    checkpoint (its dead letters were recorded then; the split's offset is already past it).
    """

    split_id: int
    start: int
    end: int
    rows: pa.RecordBatch
    dead: list[DeadLetter]
    max_event_time: datetime | None
    replay: bool = False
    #: For a replay block: the index of the restored range (``SplitAssignment.pending``) it
    #: re-reads.
    replay_entry: int = 0
    #: The day each of ``dead`` counts on (same order) when the reader knows one for a split
    #: without a landing day (a Kafka message's timestamp); None: the landing day's rule.
    dead_days: list[date | None] | None = None

    @property
    def next_offset(self) -> int:
        return self.end


@dataclass(slots=True)
class Batch:
    """The element of the operator chain: records of one split, in input order.

    ``span``: the offsets the records came from (what a checkpoint stores for a batch still
    in flight; restore re-reads it); ``only``: set when the batch holds just some records of
    the span (re-batched after a per-record step) — their offsets. ``dead``: records the step
    that produced this batch rejected, recorded when the batch moves on; ``dropped``: records
    that step removed.
    """

    split_id: int
    rows: pa.RecordBatch
    span: tuple[int, int]
    only: tuple[int, ...] | None = None
    dead: list[DeadLetter] = field(default_factory=list)
    dropped: int = 0
    #: Records still without a lookup match after this attempt (FLIP-234 retry predicate).
    misses: int = 0


def user_rows(rows: pa.RecordBatch) -> pa.RecordBatch:
    """``rows`` without the offset column (what user functions see)."""
    return rows.drop_columns([OFFSET]) if OFFSET in rows.schema.names else rows


def with_offsets(rows: pa.RecordBatch, offsets: pa.Array | Sequence[int]) -> pa.RecordBatch:
    """``rows`` (user fields) with ``offsets`` appended as the offset column."""
    array = offsets if isinstance(offsets, pa.Array) else pa.array(offsets, pa.int64())
    return rows.append_column(pa.field(OFFSET, pa.int64(), nullable=False), array)
