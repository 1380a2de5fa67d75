"""A Parquet batch as rows of a source's schema: cast column-wise, or converted row by row.

The declared columns (a column missing from the file is all null) are cast column-wise to
the declared types where a cast is known to give what the exact per-row path
(:meth:`RecordConverter.from_values`) gives: integers to integers and (exactly) to floats,
floats to floats (finite), decimals to decimals (safe: no rounding, within precision), text
to text (valid UTF-8), text or bytes to bytes, timestamps to timestamps (nanoseconds
truncated to microseconds, as the row path sees them; naive means UTC), dates to dates
(whole days), all within Python's range. A batch with another pair of types, a cast that
fails, a non-finite float or a null in a required column goes row by row to find the bad
rows; a bad row's dead letter holds the row as JSON.

Threading: immutable; any thread (the fetcher thread).
"""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from spark_jobs._dead_letters import BAD_VALUE
from spark_jobs.source._batch import DeadLetter, RecordSchema
from spark_jobs.source._convert import RecordConverter, raw_json

__all__ = ["BatchConverter"]

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROS = (  # the timestamps Python can hold
    (datetime.min.replace(tzinfo=UTC) - _EPOCH) // timedelta(microseconds=1),
    (datetime.max.replace(tzinfo=UTC) - _EPOCH) // timedelta(microseconds=1),
)
_DAYS = ((date.min - _EPOCH.date()).days, (date.max - _EPOCH.date()).days)
_UTC = pa.timestamp("us", tz="UTC")


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


class BatchConverter:
    """Converts Parquet batches (the declared columns present in the file) to rows."""

    def __init__(self, schema: RecordSchema) -> None:
        self._schema = schema
        self._converter = RecordConverter(schema)
        self._names = [field.name for field in schema.fields]
        self._required = [field.name for field in schema.fields if field.name in schema.required]

    def convert(
        self, batch: pa.RecordBatch, first_row: int
    ) -> tuple[pa.RecordBatch, list[DeadLetter]]:
        """(rows, dead letters) of ``batch``, whose first row has the offset ``first_row``."""
        columns = self.columns(batch)
        if columns is None:
            return self.by_row(batch, first_row)
        offsets = pa.array(range(first_row, first_row + batch.num_rows), pa.int64())
        return pa.RecordBatch.from_arrays([*columns, offsets], schema=self._schema.batch_schema), []

    def columns(self, batch: pa.RecordBatch) -> list[pa.Array] | None:
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

    def by_row(
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
                    unreadable = unreadable or f"{BAD_VALUE}: {name} cannot be read: {exc}"
            parsed = unreadable or self._converter.from_values(
                [values.get(name) for name in self._names]
            )
            if isinstance(parsed, str):
                dead.append((first_row + i, raw_json(values), parsed))
            else:
                rows.append(parsed)
                offsets.append(first_row + i)
        return self._converter.to_batch(rows, offsets), dead
