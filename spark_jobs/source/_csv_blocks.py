"""The CSV fast path: a block of whole lines parsed column-wise by ``pyarrow.csv``, only where
the result is provably the rows the exact per-line path (``CsvLinesParser.parse_line``)
gives; everything else goes the exact way, so dead letters (offset, raw bytes, reason) are
the exact path's.

A piece of lines is *clean* when it has no ``"``, ``\\r`` or NUL byte (so Python's ``csv``
and Arrow split every line at its commas alike, and no quoting rule is involved), is UTF-8,
has no blank line and no line over the limit (so lines and Arrow's rows pair one to one, in
order). Arrow hands a line with another number of fields than the header to its
``invalid_row_handler`` (checked to be that line), which skips it: a *suspect*. Every other
line's declared fields must be in a form whose Arrow cast equals the exact conversion:

- ``string``: any text; ``binary``: its UTF-8 bytes.
- ``int8…int64``: ``-?[0-9]{1,18}``, then in the declared range.
- ``float32/float64``: ``-?[0-9]{1,15}(\\.[0-9]{1,15})?`` (both parsers round correctly;
  float32 rounds from the double, as the exact path does).
- ``decimal(p,s)``: ``-?[0-9]{1,p-s}(\\.[0-9]{1,s})?`` (at most the digits that fit: no
  rounding, no overflow); ``p == s`` is not taken.
- ``timestamp``/``timestamp_naive``/``date``: the JSON fast path's strict forms
  (``_json_columns``).
- an empty field is null; a null ``required`` field makes the line a suspect. ``bool``
  fields are not taken (the whole file goes the exact way).

A line whose field text is not in those forms (or a null required field) is a *suspect*: it
alone goes the exact way and its row (if any) is put back in line order. A piece whose lines
do not pair with Arrow's rows (the byte and line rules above, Arrow's errors, a cast that
fails) is halved at a line boundary until pieces are clean or at most ``EXACT_LINES`` lines,
which go the exact way (as JSON blocks do, ``_blocks``).

Threading: immutable; any thread (the fetcher thread).
"""

from __future__ import annotations

from collections.abc import Callable
from itertools import accumulate
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv

from spark_jobs.source._batch import OFFSET, DeadLetter, RecordSchema
from spark_jobs.source._json_columns import _DATE, _TIME, _timestamp

__all__ = ["EXACT_LINES", "CsvBlockParser"]

#: A piece of at most this many lines that is not clean goes the exact way, line by line.
EXACT_LINES = 64

_INT = r"^-?[0-9]{1,18}$"
_FLOAT = r"^-?[0-9]{1,15}(\.[0-9]{1,15})?$"
_INT_RANGES = {
    pa.int8(): (-(1 << 7), (1 << 7) - 1),
    pa.int16(): (-(1 << 15), (1 << 15) - 1),
    pa.int32(): (-(1 << 31), (1 << 31) - 1),
    pa.int64(): (-(1 << 63), (1 << 63) - 1),
}


class _Unclean(Exception):
    """The piece is not clean: halve it or parse it exactly."""


#: A column's text (empty fields null) -> (the column in the declared type, the mask of its
#: suspect rows or None); suspect rows are null in the column and go the exact way. May raise
#: ArrowInvalid (the piece is then halved).
_Finish = Callable[[pa.Array], tuple[pa.Array, pa.Array | None]]


def _matching(column: pa.Array, pattern: str) -> tuple[pa.Array, pa.Array | None]:
    """(``column`` with the values not matching ``pattern`` nulled, their mask or None)."""
    ok = pc.match_substring_regex(column, pattern)
    if pc.all(ok, min_count=0).as_py():  # the usual case: one aggregate, no mask
        return column, None
    bad = pc.invert(pc.fill_null(ok, True))
    return pc.if_else(bad, pa.scalar(None, column.type), column), bad


def _int(kind: pa.DataType) -> _Finish:
    low, high = _INT_RANGES[kind]

    def finish(column: pa.Array) -> tuple[pa.Array, pa.Array | None]:
        column, bad = _matching(column, _INT)
        numbers = column.cast(pa.int64())
        bounds = pc.min_max(numbers)
        smallest, largest = bounds["min"].as_py(), bounds["max"].as_py()
        if smallest is not None and (smallest < low or largest > high):
            out = pc.fill_null(pc.or_(pc.less(numbers, low), pc.greater(numbers, high)), False)
            bad = out if bad is None else pc.or_(bad, out)
            numbers = pc.if_else(out, pa.scalar(None, pa.int64()), numbers)
        return numbers.cast(kind), bad

    return finish


def _float(kind: pa.DataType) -> _Finish:
    def finish(column: pa.Array) -> tuple[pa.Array, pa.Array | None]:
        column, bad = _matching(column, _FLOAT)
        return column.cast(pa.float64()).cast(kind, safe=False), bad

    return finish


def _decimal(kind: pa.DataType) -> _Finish | None:
    whole, scale = kind.precision - kind.scale, kind.scale
    if whole < 1:
        return None
    pattern = rf"^-?[0-9]{{1,{whole}}}" + (rf"(\.[0-9]{{1,{scale}}})?$" if scale else "$")

    def finish(column: pa.Array) -> tuple[pa.Array, pa.Array | None]:
        column, bad = _matching(column, pattern)
        return column.cast(kind), bad

    return finish


def _time(kind: pa.DataType) -> _Finish:
    cast = _timestamp(kind)

    def finish(column: pa.Array) -> tuple[pa.Array, pa.Array | None]:
        column, bad = _matching(column, _TIME)
        return cast(column, True), bad  # True: no offset means UTC, as in the exact path

    return finish


def _date(column: pa.Array) -> tuple[pa.Array, pa.Array | None]:
    column, bad = _matching(column, _DATE)
    return column.cast(pa.date32()), bad


def _plan(kind: pa.DataType) -> _Finish | None:
    """How a declared type's text becomes its column; None: not taken by the fast path."""
    if pa.types.is_string(kind):
        return lambda column: (column, None)
    if pa.types.is_binary(kind):
        return lambda column: (column.cast(kind), None)
    if kind in _INT_RANGES:
        return _int(kind)
    if pa.types.is_floating(kind):
        return _float(kind)
    if pa.types.is_decimal128(kind):
        return _decimal(kind)
    if pa.types.is_timestamp(kind):
        return _time(kind)
    if pa.types.is_date32(kind):
        return _date
    return None


#: The exact path over whole lines at an offset: (rows, dead letters in offset order).
Exact = Callable[[bytes, int], tuple[pa.RecordBatch, list[DeadLetter]]]


class CsvBlockParser:
    """Parses data lines of one CSV file (``header`` its column names) column-wise where
    clean, with ``exact`` (the per-line path) for the rest. ``usable`` is False when the
    schema or header rules the fast path out (then use ``exact`` for everything)."""

    def __init__(self, schema: RecordSchema, header: list[str], limit: int, exact: Exact):
        self._schema = schema.batch_schema
        # The same without NOT NULL: suspect rows are null until they are filtered out.
        self._nullable = pa.schema([f.with_nullable(True) for f in self._schema])
        self._required = set(schema.required)
        self._limit, self._exact = limit, exact
        self._width = len(header)
        position = {name: i for i, name in enumerate(header)}
        self._fields = [(f, position.get(f.name), _plan(f.type)) for f in schema.fields]
        self.usable = (
            self._width >= 2
            and all(plan for _, _, plan in self._fields)
            and not any(i is None and f.name in self._required for f, i, _ in self._fields)
        )
        self._names = [f"c{i}" for i in range(self._width)]
        wanted = sorted({i for _, i, _ in self._fields if i is not None})
        self._convert = pacsv.ConvertOptions(
            column_types={name: pa.string() for name in self._names},
            null_values=[""],
            strings_can_be_null=True,
            include_columns=[self._names[i] for i in wanted],
        )

    def parse(self, data: bytes, offset: int) -> tuple[pa.RecordBatch, list[DeadLetter]]:
        """Whole data lines ``data`` at file offset ``offset`` (never the header line): (rows
        in line order, dead letters in offset order), exactly as ``exact`` gives them."""
        pieces: list[pa.RecordBatch] = []
        dead: list[DeadLetter] = []
        self._piece(data, offset, pieces, dead)
        if len(pieces) == 1:
            return pieces[0], dead
        if not pieces:  # every line was a suspect and none gave a row
            return pa.RecordBatch.from_pylist([], schema=self._schema), dead
        return pa.concat_batches(pieces), dead

    def _piece(
        self, data: bytes, offset: int, pieces: list[pa.RecordBatch], dead: list[DeadLetter]
    ) -> None:
        lines = data.split(b"\n")
        if not lines[-1]:
            lines.pop()  # after the final newline
        try:
            self._clean(data, offset, lines, pieces, dead)
            return
        except (_Unclean, pa.ArrowInvalid):
            pass
        middle = data.find(b"\n", len(data) // 2)
        if len(lines) <= EXACT_LINES or middle < 0 or middle + 1 >= len(data):
            rows, letters = self._exact(data, offset)
            pieces.append(rows)
            dead.extend(letters)
            return
        self._piece(data[: middle + 1], offset, pieces, dead)
        self._piece(data[middle + 1 :], offset + middle + 1, pieces, dead)

    def _clean(
        self,
        data: bytes,
        offset: int,
        lines: list[bytes],
        pieces: list[pa.RecordBatch],
        dead: list[DeadLetter],
    ) -> None:
        """The piece's rows into ``pieces`` (suspect lines parsed exactly, in line order) and
        their dead letters into ``dead``; _Unclean or ArrowInvalid (nothing added) when the
        piece's lines do not pair with Arrow's rows."""
        if not lines or b'"' in data or b"\r" in data or b"\x00" in data:
            raise _Unclean
        try:
            data.decode("utf-8")  # undeclared columns too: Arrow checks only what it keeps
        except UnicodeDecodeError:
            raise _Unclean from None
        lengths = list(map(len, lines))
        if min(lengths) == 0 or max(lengths) > self._limit:
            raise _Unclean  # a blank line is no record; a long one is a dead letter
        read = pacsv.ReadOptions(
            column_names=self._names, use_threads=False, block_size=max(len(data) + 1, 1 << 12)
        )  # one block: Arrow numbers the rows it hands to the handler as lines of ``data``
        skipped: list[int] = []  # lines with another number of fields: suspects
        strange: list[bool] = []

        def other_width(row: Any) -> str:
            i = -1 if row.number is None else row.number - 1
            if not 0 <= i < len(lines) or row.text.encode() != lines[i]:
                strange.append(True)  # not the line we think: the piece is halved instead
            skipped.append(i)
            return "skip"

        parse = pacsv.ParseOptions(
            quote_char=False,
            double_quote=False,
            escape_char=False,
            ignore_empty_lines=False,
            invalid_row_handler=other_width,
        )
        table = pacsv.read_csv(
            pa.py_buffer(data),
            read_options=read,
            parse_options=parse,
            convert_options=self._convert,
        )
        if strange or table.num_rows != len(lines) - len(skipped):
            raise _Unclean
        line_starts = list(accumulate((n + 1 for n in lengths[:-1]), initial=offset))
        starts = pa.array(line_starts, pa.int64())
        line_no = pa.array(range(len(lines)), pa.int64())
        if skipped:
            kept = pc.invert(pc.is_in(line_no, pa.array(skipped, pa.int64())))
            starts, line_no = starts.filter(kept), line_no.filter(kept)
        columns: list[Any] = []
        masks: list[pa.Array] = []
        for field, index, finish in self._fields:
            if index is None:
                text = pa.nulls(table.num_rows, pa.string())
            else:
                text = table.column(self._names[index]).combine_chunks()
            if text.null_count and field.name in self._required:
                masks.append(pc.is_null(text))  # a dead letter ``missing field``
            assert finish is not None
            column, bad = finish(text)
            columns.append(column)
            if bad is not None:
                masks.append(bad)
        columns.append(starts)
        rows = pa.RecordBatch.from_arrays(columns, schema=self._nullable)
        if not masks and not skipped:
            pieces.append(rows.cast(self._schema))
            return
        suspects = list(skipped)
        if masks:
            suspect = masks[0]
            for mask in masks[1:]:
                suspect = pc.or_(suspect, mask)
            suspects += line_no.filter(suspect).to_pylist()
            rows = rows.filter(pc.invert(suspect))
        batches: list[pa.RecordBatch] = [rows]
        for i in sorted(suspects):
            line_rows, letters = self._exact(lines[i], line_starts[i])
            batches.append(line_rows)
            dead.extend(letters)
        merged = pa.Table.from_batches([b.cast(self._nullable) for b in batches])
        merged = merged.sort_by(OFFSET).combine_chunks()
        pieces.extend(b.cast(self._schema) for b in merged.to_batches())
