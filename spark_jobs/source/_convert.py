"""The exact per-record path: how one decoded record becomes a row of a source's schema.

Every reader's output is *defined* by this module; the column-wise fast paths (JSON Lines
blocks, Parquet casts) only take input they can prove gives the same rows.

A record decoded from its format (a JSON object via orjson, a CSV row by header name, a
Parquet row, a table row) is converted field by field to the declared Arrow types:

- absent or null (CSV: an empty field) → null. A ``required`` field that is null makes the
  record a dead letter ``missing field: a, b`` (all missing required fields, in declaration
  order; checked before any conversion). Fields not declared are ignored. Otherwise the
  first field (in declaration order) that does not convert gives the reason.
- ``string``: JSON str (else ``wrong type: F must be a string``); CSV text; Parquet/table
  str, or bytes decoded as UTF-8 (``invalid UTF-8: F is not valid UTF-8 text``).
- ``int8/16/32/64``: JSON int, not bool (``wrong type: F must be an integer``), in range
  (``bad value: F V is outside the int32 range``); CSV text matching ``[+-]?[0-9]+`` after
  strip (``wrong type: F must be an integer, got 'text'``; ``bad value: F 'text' is outside
  the int64 range``).
- ``float32/float64``: JSON int or float, not bool (``wrong type: F must be a number``);
  Parquet/table also Decimal; finite (``bad value: F V is not finite``); float32: not
  rounded to infinity (``bad value: F V is outside the float32 range``). CSV: ``float(text)``
  (``wrong type: F must be a number, got 'text'``).
- ``bool``: JSON bool only (``wrong type: F must be a boolean``); CSV ``true/false/1/0``
  (case-insensitive, after strip; ``wrong type: F must be a boolean, got 'text'``).
- ``decimal(p,s)``: JSON string (exact ``Decimal(text)``; ``bad value: F 'text' is not a
  decimal number``) or number (``Decimal(repr(float))``, or the int); Parquet/table also
  Decimal; CSV ``Decimal(text)`` (``wrong type: F must be a decimal number, got 'text'``).
  It must be finite and fit without rounding: at most ``s`` fractional digits and at most
  ``p-s`` integer digits, trailing zeros aside (``bad value: F V does not fit
  decimal(p,s)``).
- ``timestamp`` (UTC, µs): ISO-8601 text (``datetime.fromisoformat``; no offset means UTC;
  ``bad value: F 'text' is not ISO-8601``); Parquet/table also datetime (naive = UTC).
  ``timestamp_naive``: the same, kept naive (aware values converted to UTC, then made
  naive). A time whose UTC form leaves Python's range: ``bad value: F V is out of range``.
- ``date``: ``YYYY-MM-DD`` text (``bad value: F 'text' is not a YYYY-MM-DD date``);
  Parquet/table also date.
- ``binary``: JSON/CSV text as UTF-8 bytes; Parquet/table bytes (or text).

Before that, per format: a line (JSON Lines, CSV) longer than the reader's limit is ``line
too long: over N bytes``; a blank line is no record; a line that is not valid UTF-8 is
``invalid UTF-8: line is not valid UTF-8 text``. JSON: orjson's error as ``invalid JSON:
…``, a value that is not an object ``wrong type: expected a JSON object, got list``. CSV
(see ``_csv``): ``invalid CSV: …`` (unbalanced quotes included), a row with another number
of fields than the header ``bad value: expected 5 fields, got 4``. Parquet: a value Python
cannot hold ``bad value: F cannot be read: …``.

Reasons are ``category: detail``; the categories are ``invalid JSON``, ``invalid UTF-8``,
``invalid CSV``, ``missing field``, ``wrong type``, ``bad value`` and ``line too long``.
In reasons, ``V`` is a number as Python prints it and ``'text'`` the first 40 characters of
a text value.

Threading: immutable after construction; any thread (used on the fetcher thread).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.compute as pc

from spark_jobs._dead_letters import MISSING_FIELD
from spark_jobs.source._batch import DeadLetter, ParsedBlock, RecordSchema
from spark_jobs.source._fields import Convert, FieldError, text_converter, value_converter

__all__ = ["RecordConverter", "max_event_time", "new_block", "raw_json"]


# -- records ------------------------------------------------------------------------------------


class RecordConverter:
    """The exact conversion of records to rows of one :class:`RecordSchema`.

    Each ``from_*`` returns the row (a tuple of converted values, declaration order) or the
    dead-letter reason (``"category: detail"``).
    """

    def __init__(self, schema: RecordSchema) -> None:
        self.schema = schema
        self.names = tuple(field.name for field in schema.fields)
        self._required = [(i, n) for i, n in enumerate(self.names) if n in schema.required]
        self._json = [value_converter(field, rows=False) for field in schema.fields]
        self._rows = [value_converter(field, rows=True) for field in schema.fields]
        self._text = [text_converter(field) for field in schema.fields]
        self._batch_schema = schema.batch_schema

    def from_json(self, obj: Mapping[str, Any]) -> tuple[Any, ...] | str:
        """A decoded JSON object."""
        return self._convert([obj.get(name) for name in self.names], self._json)

    def from_values(self, values: Sequence[Any]) -> tuple[Any, ...] | str:
        """A Parquet or table row: its values in declaration order (None: absent or null)."""
        return self._convert(values, self._rows)

    def from_text(self, values: Sequence[str | None]) -> tuple[Any, ...] | str:
        """A CSV row: its fields' text in declaration order (None: absent or empty)."""
        return self._convert(values, self._text)

    def _convert(self, values: Sequence[Any], converters: list[Convert]) -> tuple[Any, ...] | str:
        missing = [name for i, name in self._required if values[i] is None]
        if missing:
            return f"{MISSING_FIELD}: {', '.join(missing)}"
        try:
            return tuple(
                None if value is None else convert(value)
                for convert, value in zip(converters, values, strict=True)
            )
        except FieldError as bad:
            return str(bad.args[0])

    def to_batch(self, rows: Sequence[tuple[Any, ...]], offsets: Sequence[int]) -> pa.RecordBatch:
        """Converted rows and their offsets as a batch of ``schema.batch_schema``."""
        if not rows:
            return self.empty()
        columns = list(zip(*rows, strict=True))
        arrays = [
            pa.array(column, type=field.type)
            for column, field in zip(columns, self.schema.fields, strict=True)
        ]
        arrays.append(pa.array(offsets, pa.int64()))
        return pa.RecordBatch.from_arrays(arrays, schema=self._batch_schema)

    def empty(self) -> pa.RecordBatch:
        """No rows."""
        return pa.RecordBatch.from_arrays(
            [pa.array([], type=field.type) for field in self._batch_schema],
            schema=self._batch_schema,
        )


def max_event_time(schema: RecordSchema, rows: pa.RecordBatch) -> datetime | None:
    """The largest event time of ``rows`` (UTC; None without an event-time field or rows)."""
    if schema.event_time is None or not rows.num_rows:
        return None
    value = pc.max(rows.column(schema.event_time)).as_py()
    if not isinstance(value, datetime):
        return None
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def new_block(
    schema: RecordSchema,
    split_id: int,
    start: int,
    end: int,
    rows: pa.RecordBatch,
    dead: list[DeadLetter],
) -> ParsedBlock:
    """A block of records ``[start, end)``; ``dead`` is put in offset order."""
    dead.sort(key=lambda entry: entry[0])
    return ParsedBlock(split_id, start, end, rows, dead, max_event_time(schema, rows))


def _jsonable(value: Any) -> Any:
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value).decode("utf-8", "backslashreplace")
    return str(value)


def _finite_or_text(value: Any) -> Any:
    return repr(value) if isinstance(value, float) and not math.isfinite(value) else value


def raw_json(values: Mapping[str, Any]) -> bytes:
    """A row as JSON bytes (the raw form of a Parquet or table row's dead letter): bytes as
    UTF-8 text (invalid bytes escaped), decimals and other values as text, a non-finite float
    as its text (``nan``, ``inf``: JSON has no such number, and orjson would write null — the
    very value the dead letter is about)."""
    if any(isinstance(v, float) and not math.isfinite(v) for v in values.values()):
        values = {k: _finite_or_text(v) for k, v in values.items()}
    try:
        return orjson.dumps(values, default=_jsonable)
    except TypeError:  # e.g. an int beyond 64 bits
        return repr(dict(values)).encode()
