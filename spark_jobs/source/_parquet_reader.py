"""Reader of Parquet row-group splits in blocks (runs in a fetcher thread).

A FileSplit of kind ``"parquet"`` covers row groups ``[start, end)`` of its file (``end``
None: through the last row group). Offset rule: an offset is a *row index within the file*,
the first row not yet emitted. A fresh assignment has ``resume_offset == split.start`` (the
split store hands out ``start_offset``, a row-group index, while nothing is committed), so
reading begins at ``max(resume_offset, first row of row group start)``. That is exact when
the first row of row group ``start`` is at least ``start`` (always true without empty row
groups): every emitted offset then lies above it. Otherwise a committed row offset could
equal ``start``, so such a split (with rows) fails with :class:`ParquetSplitError`: the
enumerator must not start a split right after empty row groups. Resuming inside a row group
decodes that row group from its beginning and skips the rows before the offset. A replay
read of rows ``[a, b)`` reads exactly those rows.

Each ``fetch`` turns one ``iter_batches`` batch into a block: the declared columns (a column
missing from the file is all null) cast column-wise to the declared types, where a cast is
known to give what the exact per-row path (:meth:`RecordConverter.from_values`) gives:
integers to integers and (exactly) to floats, floats to floats (finite), decimals to
decimals (safe: no rounding, within precision), text to text (valid UTF-8), text or bytes to
bytes, timestamps to timestamps (nanoseconds truncated to microseconds, as the row path
sees them; naive means UTC), dates to dates (whole days), all within Python's range. A batch
with another pair of types, a cast that fails, a non-finite float or a null in a required
column goes row by row to find the bad rows; a bad row's dead letter holds the row as JSON.

Threading: ``open`` and ``fetch`` may block on file I/O and are called by one fetcher thread
only; ``wake_up`` may be called from any thread (a ``fetch`` reads at most one batch, so it
returns soon anyway).
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Iterator
from datetime import UTC, date, datetime, timedelta
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from spark_jobs.source._batch import DeadLetter, ParsedBlock, RecordSchema
from spark_jobs.source._convert import RecordConverter, new_block, raw_json
from spark_jobs.source._records import SplitRead

__all__ = ["ParquetSplitError", "ParquetSplitReader"]

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROS = (  # the timestamps Python can hold
    (datetime.min.replace(tzinfo=UTC) - _EPOCH) // timedelta(microseconds=1),
    (datetime.max.replace(tzinfo=UTC) - _EPOCH) // timedelta(microseconds=1),
)
_DAYS = ((date.min - _EPOCH.date()).days, (date.max - _EPOCH.date()).days)
_UTC = pa.timestamp("us", tz="UTC")


class ParquetSplitError(RuntimeError):
    """A Parquet file is unreadable (missing, corrupt, fewer row groups than the split names).

    Raised from ``open``/``fetch``: the task fails and the split is retried. An unreadable
    file is not a malformed *record*, so it is never dead-lettered row by row.
    """


def _within(values: pa.Array, bounds: tuple[int, int]) -> bool:
    extremes = pc.min_max(values)
    low, high = extremes["min"].as_py(), extremes["max"].as_py()
    return low is None or (bounds[0] <= low and high <= bounds[1])


def _microseconds(column: pa.Array) -> pa.Array:
    """A timestamp column in microseconds, UTC (naive means UTC); nanoseconds truncated."""
    kind = column.type
    if kind.unit == "ns":
        column = column.cast(pa.timestamp("us", tz=kind.tz), safe=False)
    return column.cast(_UTC)


def _cast(column: pa.Array, kind: pa.DataType) -> pa.Array | None:
    """``column`` in ``kind`` when that is what the row path gives; None: decide row by row.
    May raise ArrowInvalid (also: decide row by row)."""
    given = column.type
    if pa.types.is_dictionary(given):
        column = column.dictionary_decode()
        given = column.type
    if pa.types.is_null(given):
        return pa.nulls(len(column), kind)
    if pa.types.is_integer(kind) and pa.types.is_integer(given):
        return column.cast(kind)
    if pa.types.is_floating(kind) and (pa.types.is_integer(given) or pa.types.is_floating(given)):
        if pa.types.is_integer(given):
            return column.cast(kind)  # exact or ArrowInvalid
        cast = column.cast(kind, safe=False)  # float64 -> float32 rounds as Python does
        return cast if pc.all(pc.is_finite(cast), min_count=0).as_py() else None
    if pa.types.is_decimal128(kind) and pa.types.is_decimal(given):
        return column.cast(pa.decimal128(38, kind.scale)).cast(kind)  # checks precision
    textual = pa.types.is_string(given) or pa.types.is_large_string(given)
    binary = pa.types.is_binary(given) or pa.types.is_large_binary(given)
    if pa.types.is_string(kind) and (textual or binary):
        return column.cast(kind)  # binary: ArrowInvalid unless valid UTF-8
    if pa.types.is_binary(kind) and (textual or binary):
        return column.cast(kind)
    if pa.types.is_boolean(kind) and pa.types.is_boolean(given):
        return column
    if pa.types.is_timestamp(kind) and pa.types.is_timestamp(given):
        utc = _microseconds(column)
        if not _within(utc.view(pa.int64()), _MICROS):
            return None
        return utc if kind.tz is not None else utc.cast(kind)
    if pa.types.is_date32(kind) and pa.types.is_date(given):
        days = column.cast(kind)  # date64: ArrowInvalid unless whole days
        return days if _within(days.view(pa.int32()), _DAYS) else None
    return None


class ParquetSplitReader:
    """Reads one read of a Parquet split at a time, up to ``batch_rows`` rows per block."""

    def __init__(self, schema: RecordSchema, *, batch_rows: int = 1024) -> None:
        self._schema = schema
        self._converter = RecordConverter(schema)
        self._names = [field.name for field in schema.fields]
        self._required = [field.name for field in schema.fields if field.name in schema.required]
        self._batch_rows = batch_rows
        self._read: SplitRead | None = None
        self._file: Any = None  # pq.ParquetFile
        self._batches: Iterator[Any] = iter(())  # pa.RecordBatch
        self._row = 0  # row index of the next row the batches yield
        self._first = 0  # first row to emit (rows before it are skipped)
        self._stop = 0  # first row not to emit

    def open(self, read: SplitRead) -> None:
        self.close()
        self._read = read
        try:
            self._open(read)
        except (OSError, ValueError, pa.ArrowException) as exc:
            raise self._error(exc) from exc

    def _open(self, read: SplitRead) -> None:
        split = read.split
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
        self._first = max(read.resume, firsts[split.start])
        self._stop = firsts[end] if read.stop is None else min(read.stop, firsts[end])
        if self._first >= self._stop:
            self._batches = iter(())
            return
        # From the last row group starting at or before the first row (skips empty groups)
        # to the one holding the last row.
        group = max(split.start, bisect_right(firsts, self._first) - 1)
        last = min(end, bisect_left(firsts, self._stop))
        self._row = firsts[group]
        present = set(self._file.schema_arrow.names)
        self._batches = self._file.iter_batches(
            batch_size=self._batch_rows,
            row_groups=list(range(group, last)),
            columns=[name for name in self._names if name in present],
        )

    def fetch(self) -> tuple[ParsedBlock | None, bool]:
        if self._read is None:
            return None, True
        while True:
            try:
                batch = next(self._batches, None)
            except (OSError, ValueError, pa.ArrowException) as exc:
                raise self._error(exc) from exc
            if batch is None:
                self.close()
                return None, True
            first_row = self._row
            self._row += batch.num_rows
            skip = max(0, self._first - first_row)
            take = min(batch.num_rows, self._stop - first_row) - skip
            done = self._row >= self._stop
            if take > 0:
                block = self._block(batch.slice(skip, take), first_row + skip)
                if done:
                    self.close()
                return block, done
            if done:
                self.close()
                return None, True

    def _block(self, batch: pa.RecordBatch, first_row: int) -> ParsedBlock:
        assert self._read is not None
        offsets = pa.array(range(first_row, first_row + batch.num_rows), pa.int64())
        columns = self._columns(batch)
        if columns is not None:
            rows = pa.RecordBatch.from_arrays([*columns, offsets], schema=self._schema.batch_schema)
            dead: list[DeadLetter] = []
        else:
            rows, dead = self._by_row(batch, first_row)
        end = first_row + batch.num_rows
        return new_block(self._schema, self._read.split_id, first_row, end, rows, dead)

    def _columns(self, batch: pa.RecordBatch) -> list[pa.Array] | None:
        """The declared columns, cast column-wise; None when the batch goes row by row."""
        names = batch.schema.names
        columns = []
        for field in self._schema.fields:
            if field.name not in names:
                if field.name in self._required and batch.num_rows:
                    return None
                columns.append(pa.nulls(batch.num_rows, field.type))
                continue
            try:
                column = _cast(batch.column(field.name), field.type)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
                return None
            if column is None or (field.name in self._required and column.null_count):
                return None
            columns.append(column)
        return columns

    def _by_row(
        self, batch: pa.RecordBatch, first_row: int
    ) -> tuple[pa.RecordBatch, list[DeadLetter]]:
        """The exact path: each row's values through the converter."""
        names = [name for name in self._names if name in batch.schema.names]
        arrays = []
        for name in names:  # as Python sees them: text, bytes, UTC datetimes, dates, ...
            column = batch.column(name)
            if pa.types.is_dictionary(column.type):
                column = column.dictionary_decode()
            if pa.types.is_timestamp(column.type):
                column = _microseconds(column)
            arrays.append(column)
        listed: list[list[Any] | None] = []
        for column in arrays:
            try:
                listed.append(column.to_pylist())
            except (ValueError, OverflowError):  # e.g. a date beyond year 9999: value by value
                listed.append(None)
        rows: list[tuple[Any, ...]] = []
        offsets: list[int] = []
        dead: list[DeadLetter] = []
        for i in range(batch.num_rows):
            values: dict[str, Any] = {}
            unreadable = None
            for name, column, values_of in zip(names, arrays, listed, strict=True):
                if values_of is not None:
                    values[name] = values_of[i]
                    continue
                try:
                    values[name] = column[i].as_py()
                except (ValueError, OverflowError) as exc:
                    unreadable = unreadable or f"bad value: {name} cannot be read: {exc}"
            parsed = unreadable or self._converter.from_values(
                [values.get(name) for name in self._names]
            )
            if isinstance(parsed, str):
                dead.append((first_row + i, raw_json(values), parsed))
            else:
                rows.append(parsed)
                offsets.append(first_row + i)
        return self._converter.to_batch(rows, offsets), dead

    def wake_up(self) -> None:
        """Nothing to interrupt: a ``fetch`` reads one batch."""

    def close(self) -> None:
        self._batches = iter(())
        if self._file is not None:
            self._file.close()
            self._file = None

    def _error(self, exc: BaseException) -> ParquetSplitError:
        read = self._read
        assert read is not None
        split = read.split
        self.close()
        return ParquetSplitError(
            f"split {read.split_id}: cannot read Parquet file {split.path} "
            f"(row groups [{split.start}, {split.end})): {exc}"
        )
