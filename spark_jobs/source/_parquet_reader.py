"""Blocking reader of Parquet row-group splits (runs in a fetcher thread)."""

from __future__ import annotations

import math
from bisect import bisect_right
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any, TypeAlias

import orjson
import pyarrow as pa
import pyarrow.parquet as pq

from enumerator_service import SplitAssignment
from spark_jobs.source._events import Event, validate_event
from spark_jobs.source._records import RawLine, RecordsWithSplitIds

__all__ = [
    "ParquetSplitError",
    "ParquetSplitReader",
    "RowRecord",
    "RowsWithSplitIds",
    "parse_parquet_record",
]


@dataclass(frozen=True, slots=True)
class RowRecord:
    """One row of a Parquet split: its row index in the file, the next index, its values.

    Offset rule: offsets of Parquet splits are *row indices within the file* (not bytes);
    ``next_offset`` (= ``offset + 1``) is the first row not yet emitted once this row is.
    """

    offset: int
    next_offset: int
    values: dict[str, Any]

    def as_raw_line(self) -> RawLine:
        """The row as JSON bytes, for the dead-letter path (which stores raw lines)."""
        return RawLine(self.offset, self.next_offset, orjson.dumps(self.values, default=str))


#: A fetch of Parquet or table rows.
RowsWithSplitIds: TypeAlias = RecordsWithSplitIds[RowRecord]


class ParquetSplitError(RuntimeError):
    """A Parquet file is unreadable (missing, corrupt, fewer row groups than the split names).

    Raised from ``fetch``: the task fails and the split is retried. An unreadable file is not a
    malformed *record*, so it is never dead-lettered row by row.
    """


class ParquetSplitReader:
    """Reads the rows of its splits one after another, ``batch_rows`` rows per ``fetch``.

    A FileSplit of kind ``"parquet"`` covers row groups ``[start, end)`` of its file (``end``
    None: through the last row group). Offset rule: an offset is a *row index within the file*,
    the first row not yet emitted. A fresh assignment has ``resume_offset == split.start`` (the
    split store hands out ``start_offset``, a row-group index, while nothing is committed), so
    reading begins at ``max(resume_offset, first row of row group start)``. That is exact when
    the first row of row group ``start`` is at least ``start`` (always true without empty row
    groups): every emitted ``next_offset`` then lies above it. Otherwise a committed row offset
    could equal ``start``, so such a split (with rows) fails with :class:`ParquetSplitError`:
    the enumerator must not start a split right after empty row groups. Resuming inside a row
    group decodes that row group from its beginning and skips the rows before the offset.

    Timestamp columns in nanoseconds are truncated to microseconds (Python datetimes).

    Threading: ``fetch`` may block on file I/O and is called by one fetcher thread only;
    ``wake_up`` may be called from any thread (a ``fetch`` reads at most one batch, so it
    returns soon anyway).
    """

    def __init__(self, *, batch_rows: int = 1024, columns: Sequence[str] | None = None) -> None:
        self._batch_rows = batch_rows
        self._columns = list(columns) if columns is not None else None
        self._splits: deque[SplitAssignment] = deque()
        self._current: SplitAssignment | None = None
        self._file: Any = None  # pq.ParquetFile
        self._batches: Iterator[Any] | None = None  # pa.RecordBatch
        self._row = 0  # row index of the next row the batches yield
        self._first = 0  # first row to emit (rows before it are skipped)
        self._woken = False

    def add_split(self, assignment: SplitAssignment) -> None:
        self._splits.append(assignment)

    def has_splits(self) -> bool:
        return self._current is not None or bool(self._splits)

    def wake_up(self) -> None:
        self._woken = True

    def close(self) -> None:
        self._batches = None
        if self._file is not None:
            self._file.close()
            self._file = None

    def _open_next(self) -> None:
        self._current = assignment = self._splits.popleft()
        split = assignment.split
        self._file = pq.ParquetFile(split.path)
        meta = self._file.metadata
        groups = int(meta.num_row_groups)
        end = groups if split.end is None else split.end
        if not 0 <= split.start <= end <= groups:
            raise ValueError(f"row groups [{split.start}, {split.end}) outside 0..{groups}")
        firsts = [0]  # first row of each row group, and the row count at the end
        for index in range(groups):
            firsts.append(firsts[-1] + int(meta.row_group(index).num_rows))
        if firsts[split.start] < min(split.start, firsts[end]):  # a split with rows
            raise ValueError(
                f"row group {split.start} starts at row {firsts[split.start]}, below its own "
                "index (empty row groups before it): a fresh resume offset would be ambiguous"
            )
        self._first = max(assignment.resume_offset, firsts[split.start])
        # The last row group starting at or before row self._first (skips empty groups).
        group = max(split.start, bisect_right(firsts, self._first) - 1)
        self._row = firsts[group]
        if self._first >= firsts[end]:
            self._batches = iter(())
            return
        self._batches = self._file.iter_batches(
            batch_size=self._batch_rows, row_groups=list(range(group, end)), columns=self._columns
        )

    def fetch(self) -> RowsWithSplitIds:
        """Up to ``batch_rows`` rows of the current split; marks the split finished at its end."""
        self._woken = False
        batch = RowsWithSplitIds()
        if self._current is None:
            if not self._splits:
                return batch
            try:
                self._open_next()
            except (OSError, ValueError, pa.ArrowException) as exc:
                raise self._error(exc) from exc
        assert self._current is not None and self._batches is not None
        split_id = self._current.split_id
        rows: list[RowRecord] = []
        while not rows and not self._woken:
            try:
                arrow = next(self._batches, None)
                values = None if arrow is None else _to_pylist(arrow)
            except (OSError, ValueError, pa.ArrowException) as exc:
                raise self._error(exc) from exc
            if values is None:
                batch.finished.append(split_id)
                self.close()
                self._current = None
                break
            skip = max(0, min(len(values), self._first - self._row))
            rows.extend(
                RowRecord(self._row + i, self._row + i + 1, values[i])
                for i in range(skip, len(values))
            )
            self._row += len(values)
        if rows:
            batch.records[split_id] = rows
        return batch

    def _error(self, exc: BaseException) -> ParquetSplitError:
        assert self._current is not None
        split = self._current.split
        self.close()
        return ParquetSplitError(
            f"split {self._current.split_id}: cannot read Parquet file {split.path} "
            f"(row groups [{split.start}, {split.end})): {exc}"
        )


def _to_pylist(batch: Any) -> list[dict[str, Any]]:
    """The rows of a pa.RecordBatch; nanosecond timestamps are truncated to microseconds."""
    fields = list(batch.schema)
    micros = [
        f.with_type(pa.timestamp("us", tz=f.type.tz))
        if pa.types.is_timestamp(f.type) and f.type.unit == "ns"
        else f
        for f in fields
    ]
    if micros != fields:
        batch = batch.cast(pa.schema(micros), safe=False)
    rows: list[dict[str, Any]] = batch.to_pylist()
    return rows


def parse_parquet_record(split_id: int, record: RowRecord) -> Event | str:
    """The event in one Parquet row, or a dead-letter reason (``"category: detail"``).

    Conversions before :func:`validate_event`: a timestamp (datetime) ``event_time`` becomes ISO
    text (naive means UTC); binary ``event_id``/``event_type`` are decoded as UTF-8; a decimal
    ``amount`` becomes a float. Nulls count as missing; non-finite amounts and user ids outside
    the int64 range (the sink's type) are bad values.
    """
    obj = dict(record.values)
    for name in ("event_id", "event_type"):
        value = obj.get(name)
        if isinstance(value, bytes):
            try:
                obj[name] = value.decode("utf-8")
            except UnicodeDecodeError:
                return f"invalid UTF-8: {name} is not valid UTF-8 text"
    when = obj.get("event_time")
    if isinstance(when, datetime):
        obj["event_time"] = when.isoformat()
    elif when is not None and not isinstance(when, str):
        return f"wrong type: event_time must be a timestamp or ISO-8601 text, got {type(when)}"
    user_id = obj.get("user_id")
    if isinstance(user_id, int) and not -(2**63) <= user_id < 2**63:  # a uint64 column
        return f"bad value: user_id {user_id} is outside the int64 range"
    amount = obj.get("amount")
    if isinstance(amount, Decimal):
        obj["amount"] = amount = float(amount)
    if isinstance(amount, float) and not math.isfinite(amount):
        return f"bad value: amount {amount} is not finite"
    return validate_event(split_id, obj)
