"""``RowLog``: the rows of a :class:`~spark_jobs.lookup._batch_cache.BatchCache`, by position.

Every row stored gets the next *position* (1, 2, ...; 0 is never a row: the cache's index
answers 0 for "not cached"). A position's data never changes: a key stored again gets a new
position and its old one becomes garbage (``live`` 0), as does an evicted or expired row.
Per position, in flat Python buffers written with C-speed ``map``/slice operations:

- ``live`` (a bytearray: 1 a row, 2 a cached miss, whose row is nulls; 0 garbage) and ``ref``
  (the CLOCK reference bit), and the write/access times
  (``array('d')``, only when a TTL needs them);
- the looked-up columns in Arrow: one *base* RecordBatch (positions ``1 .. base_end - 1``)
  and a short *tail* of the batches appended since; rows are read by one ``take`` over
  their ``chunks()`` (the batches as one table's chunks: ``take_rows``). The tail is
  merged into the base once it holds an eighth of it (each row copied O(1) times,
  amortised), and the garbage is compacted away at a merge once it outnumbers the live rows
  (positions renumbered: the caller renumbers its index from :meth:`compact`'s answer).

Vectorised reads of ``live``/``ref``/the times copy the buffer into Arrow first (a memcpy):
no Arrow view ever pins a growable buffer.

Threading contract: not thread-safe; owned by its cache (one event loop thread).
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from itertools import compress, repeat

import pyarrow as pa
import pyarrow.compute as pc

__all__ = ["MIN_GARBAGE", "MIN_TAIL", "RowLog", "as_float64", "as_int64", "as_uint8", "take_rows"]

MIN_GARBAGE = 4096  # rows of garbage always tolerated before a compaction
MIN_TAIL = 1024  # rows the tail may hold whatever the base's size


def as_uint8(buffer: bytearray, start: int, stop: int) -> pa.Array:
    """``buffer[start:stop]`` as an Arrow uint8 array (a copy)."""
    data = bytes(buffer[start:stop])
    return pa.Array.from_buffers(pa.uint8(), len(data), [None, pa.py_buffer(data)])


def as_int64(values: array[int]) -> pa.Array:
    """An ``array('q')`` as an Arrow int64 array (a copy)."""
    data = values.tobytes()
    return pa.Array.from_buffers(pa.int64(), len(values), [None, pa.py_buffer(data)])


def as_float64(buffer: array[float], start: int, stop: int) -> pa.Array:
    """``buffer[start:stop]`` as an Arrow float64 array (a copy)."""
    data = buffer[start:stop].tobytes()
    return pa.Array.from_buffers(pa.float64(), stop - start, [None, pa.py_buffer(data)])


class RowLog:
    """Cached rows by position (module docstring). ``written``/``accessed`` are None unless
    ``times`` names them (``"written"``, ``"accessed"``). ``min_garbage``/``min_tail``: the
    garbage always tolerated, the rows the tail may always hold (class attributes: tests
    lower them to compact and merge often)."""

    min_garbage = MIN_GARBAGE
    min_tail = MIN_TAIL

    def __init__(self, types: Sequence[pa.DataType], times: frozenset[str]) -> None:
        self.schema = pa.schema([pa.field(f"c{i}", t) for i, t in enumerate(types)])
        self.live = bytearray(1)  # position 0: no row
        self.ref = bytearray(1)
        self.written: array[float] | None = array("d", [0.0]) if "written" in times else None
        self.accessed: array[float] | None = array("d", [0.0]) if "accessed" in times else None
        self._base: pa.RecordBatch = _empty(self.schema)
        self._tail: list[pa.RecordBatch] = []
        self._tail_rows = 0

    @property
    def end(self) -> int:
        """The position after the last row."""
        return len(self.live)

    def append(self, columns: Sequence[pa.Array], nulls: int, live: bytes, now: float) -> int:
        """Append the rows of ``columns`` and ``nulls`` rows of nulls (cached misses; ``live``:
        one byte per row), written and accessed at ``now``; the first position."""
        start, count = self.end, len(live)
        self.live += live
        self.ref += bytes(count)
        if self.written is not None:
            self.written.extend(repeat(now, count))
        if self.accessed is not None:
            self.accessed.extend(repeat(now, count))
        schema = self.schema
        if len(columns[0]):
            self._tail.append(pa.RecordBatch.from_arrays(list(columns), schema=schema))
        if nulls:
            empty = [pa.nulls(nulls, field.type) for field in schema]
            self._tail.append(pa.RecordBatch.from_arrays(empty, schema=schema))
        self._tail_rows += count
        return start

    def chunks(self) -> tuple[pa.RecordBatch, ...]:
        """The rows' batches: position ``p`` is row ``p - 1`` of them as one table. They
        never change (a merge or compaction makes new ones)."""
        return (self._base, *self._tail)

    def wants_merge(self) -> bool:
        base_rows: int = self._base.num_rows
        return self._tail_rows > max(base_rows // 8, self.min_tail)

    def garbage(self, live_rows: int) -> bool:
        """Whether the dead positions outnumber ``live_rows`` (and ``min_garbage``)."""
        return (self.end - 1) - live_rows > max(live_rows, self.min_garbage)

    def merge(self) -> None:
        """Fold the tail into the base (positions unchanged)."""
        if self._tail:
            self._base = pa.concat_batches([self._base, *self._tail])
            self._tail, self._tail_rows = [], 0

    def compact(self) -> list[int]:
        """Keep only the live rows, renumbered from 1 in the same order; the old positions
        of the rows kept (``result[new - 1] == old``)."""
        self.merge()
        live = self.live
        kept = list(compress(range(1, self.end), live[1:]))
        rows = pc.subtract(pa.array(kept, pa.int64()), 1)
        self._base = self._base.take(rows)
        self.ref = bytearray(b"\0") + bytearray(compress(self.ref[1:], live[1:]))
        if self.written is not None:
            self.written = array("d", [0.0, *compress(self.written[1:], live[1:])])
        if self.accessed is not None:
            self.accessed = array("d", [0.0, *compress(self.accessed[1:], live[1:])])
        self.live = bytearray(b"\0") + bytearray(compress(live[1:], live[1:]))
        return kept


def take_rows(
    schema: pa.Schema, chunks: Sequence[pa.RecordBatch], rows: pa.Array
) -> tuple[pa.Array, ...]:
    """The columns of ``rows`` (indices into ``chunks`` as one table; null: a null row), in
    their order: one ``take`` over the chunks (no copy of them first)."""
    if len(chunks) == 1:
        return tuple(chunks[0].take(rows).columns)
    taken = pa.Table.from_batches(chunks, schema=schema).take(rows)
    return tuple(_one_chunk(column) for column in taken.columns)


def _one_chunk(column: pa.ChunkedArray) -> pa.Array:
    return column.chunk(0) if column.num_chunks == 1 else column.combine_chunks()


def _empty(schema: pa.Schema) -> pa.RecordBatch:
    return pa.RecordBatch.from_arrays([pa.array([], f.type) for f in schema], schema=schema)
