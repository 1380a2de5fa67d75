"""JSON Lines blocks: a run of whole lines of one split parsed at once into Arrow columns.

Per-record Python work (one JSON object, one converted row per line) dominated a reader
subtask's CPU. A block is parsed by Arrow's JSON reader in one call, with the source's
schema as its explicit schema, and validated column-wise (:mod:`._json_columns`). The
result must be exactly what the exact path (orjson, then
:meth:`RecordConverter.from_json`) gives line by line, so the fast path only accepts a
piece of input it can prove is handled identically. A line known to be bad (it does not
end with ``}``, or Arrow's error or the UTF-8 check names it) is *masked*: replaced, for
Arrow only, by ``{`` spaces ``}`` of the same length, a row of nulls that is dropped, while
the line itself takes the exact per-line path; the block is then read whole again (offsets
unchanged). A few bad lines thus cost one more read each, not reads of the runs between
them, each with its own checks (the bench's one-in-a-thousand malformed lines made a block
~1.7x as dear as a clean one). Anything else (more than a few bad lines, a failure that
names no line, a line too short to mask) is cut in halves until the pieces are small, and
the lines of a small piece take the exact per-line path:

- every line ends with ``}`` (so none is blank or whitespace, the lines Arrow skips, and
  each yields at least one row; with "rows == lines" each line is exactly one row — Arrow
  reads ``{…} {…}`` as two, which would shift rows against line offsets). Lines that do
  not are few in practice (truncated writes): they are masked and go line by line;
- the text is valid UTF-8 without a byte order mark (Arrow checks neither; orjson does);
- Arrow accepted it with unexpected fields an *error*: only the declared fields are
  parsed, so grammar differences in other fields (``NaN``, numbers too big for a double,
  nesting beyond orjson's depth limit — Arrow accepts all three) cannot occur. A block with
  extra fields is parsed again with them ignored, behind checks for exactly those cases
  (once a block had extra fields, the next ones are parsed that way first);
- every column check passed (rows that fail one are *suspects*: decided line by line);
- no line is longer than the reader's limit (those are dead-lettered as too long).

Type mismatches (an integer field holding ``1.0``, ``true`` or ``"5"``) make Arrow fail the
piece, which then goes the exact way and gets the exact dead-letter reason.

Each row's offset (its line's first byte) fills the offset column, computed column-wise
from the line lengths. Rows come out in line order, dead letters in offset order.

Threading: a parser is used by one thread at a time (the fetcher thread); its only state is
that hint about extra fields.
"""

from __future__ import annotations

import re
from array import array
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pj

from spark_jobs._dead_letters import INVALID_JSON, INVALID_UTF8, LINE_TOO_LONG, WRONG_TYPE
from spark_jobs.source._batch import OFFSET, DeadLetter, RecordSchema
from spark_jobs.source._convert import RecordConverter
from spark_jobs.source._json_columns import ColumnChecks
from spark_jobs.source._lines import lines_of

__all__ = ["JsonLinesParser"]

_READ = pj.ReadOptions(use_threads=False, block_size=1 << 24)
#: Pieces of at most this many lines that the fast path rejects are parsed line by line.
_SMALL = 8
#: With ignored fields: longer lines go line by line (orjson's depth limit of 1024 needs more
#: than 2048 bytes of brackets, which Arrow would accept; orjson rejects numbers of 300 and
#: more digits, which Arrow would skip).
_LENIENT_MAX_LINE = 2048
_ROW = re.compile(r" in row (\d+)$")


@dataclass(slots=True)
class _Out:
    batches: list[pa.RecordBatch] = field(default_factory=list)
    dead: list[DeadLetter] = field(default_factory=list)
    in_order: bool = True


class JsonLinesParser:
    """Parses whole JSON Lines into rows of ``schema`` (and dead letters).

    ``parse`` is the fast path, ``parse_exact`` the reference it must equal (line by line).
    """

    def __init__(self, schema: RecordSchema, max_line_bytes: int) -> None:
        self._converter = RecordConverter(schema)
        self._checks = ColumnChecks(schema)
        self._limit = max_line_bytes
        self._batch_schema = schema.batch_schema
        self._strict = pj.ParseOptions(
            explicit_schema=self._checks.wire, unexpected_field_behavior="error"
        )
        self._lenient = pj.ParseOptions(
            explicit_schema=self._checks.wire, unexpected_field_behavior="ignore"
        )
        self._fast_ok = bool(schema.fields)
        #: The last block had undeclared fields (a hint; only this parser's thread uses it).
        self._extra_fields = False

    def parse(self, data: bytes, offset: int) -> tuple[pa.RecordBatch, list[DeadLetter]]:
        """Whole lines ``data`` starting at offset ``offset`` (the last one may lack its
        newline at the end of a file): (rows in line order, dead letters in offset order)."""
        out = _Out()
        if data:
            if self._fast_ok:
                self._parse(data, offset, out)
            else:
                self._by_line(data, offset, out)
        return self._result(out)

    def parse_exact(self, data: bytes, offset: int) -> tuple[pa.RecordBatch, list[DeadLetter]]:
        """The same, line by line (the definition ``parse`` must equal)."""
        out = _Out()
        self._by_line(data, offset, out)
        return self._result(out)

    def parse_line(self, content: bytes, truncated: bool = False) -> tuple[Any, ...] | str | None:
        """One line (without its line ending): the row, a dead-letter reason, or None for a
        blank line (not a record)."""
        if truncated:
            return f"{LINE_TOO_LONG}: over {self._limit} bytes"
        if not content.strip():
            return None
        try:
            obj = orjson.loads(content)
        except orjson.JSONDecodeError as exc:
            if "UTF-8" in str(exc):
                return f"{INVALID_UTF8}: line is not valid UTF-8 text"
            return f"{INVALID_JSON}: {exc}"
        if not isinstance(obj, dict):
            return f"{WRONG_TYPE}: expected a JSON object, got {type(obj).__name__}"
        return self._converter.from_json(obj)

    def _result(self, out: _Out) -> tuple[pa.RecordBatch, list[DeadLetter]]:
        if not out.batches:
            rows = self._converter.empty()
        elif len(out.batches) == 1:
            rows = out.batches[0]
        else:
            rows = pa.concat_batches(out.batches)
        if not out.in_order:  # suspects decided line by line come after their piece's rows
            rows = rows.take(pc.sort_indices(rows.column(OFFSET)))
        out.dead.sort(key=lambda entry: entry[0])
        return rows, out.dead

    def _parse(self, data: bytes, offset: int, out: _Out) -> None:
        lines = _lines(data)  # one Arrow split serves the checks below and the offsets
        count = len(lines)
        # Lines decided line by line (a line that does not end with "}", the line Arrow
        # or the UTF-8 check failed at): Arrow reads them masked, as "{ … }" of the same
        # length, so the block is read whole again and their rows are dropped; the other
        # lines keep their rows and offsets.
        exact: list[int] = []
        closed = pc.ends_with(lines, "}")
        if not pc.all(closed, min_count=0).as_py():
            closed = pc.or_(closed, pc.ends_with(lines, "}\r"))
            torn = count - pc.sum(closed, min_count=0).as_py()
            if torn and count <= _SMALL:
                self._by_line(data, offset, out)
                return
            if torn > _SMALL:
                self._halve(data, offset, out)
                return
            if torn:
                exact = pc.indices_nonzero(pc.invert(closed)).to_pylist()
        while True:
            masked = _masked(data, lines, exact) if exact else data
            if masked is None:  # a line too short to mask: the runs around it
                self._exact_around(data, offset, out, _line_ranges(data, lines, exact))
                return
            rows, suspects, failed_at = self._fast(masked, offset, lines, exact)
            if rows is not None:
                out.batches.append(rows)
                # Rows that failed a column check or were masked: line by line. They come
                # after the piece's rows, so the block is sorted by offset at the end, but
                # only when one of them is a row (most are dead letters: no sort needed).
                pieces = len(out.batches)
                for start, end in suspects:
                    self._by_line(data[start:end], offset + start, out)
                out.in_order = out.in_order and len(out.batches) == pieces
                return
            # The line that failed is known (a hint: every line is still checked in full).
            if failed_at is None or not 0 <= failed_at < count or failed_at in exact:
                break
            if len(exact) >= _SMALL:
                break
            exact = sorted([*exact, failed_at])
        if count <= _SMALL:
            self._by_line(data, offset, out)
        else:
            self._halve(data, offset, out)

    def _exact_around(
        self, data: bytes, offset: int, out: _Out, exact: Iterable[tuple[int, int]]
    ) -> None:
        """The line ranges ``exact`` (ascending, disjoint) line by line, the runs between
        them through ``_parse`` again; output in line order."""
        at = 0
        for start, end in exact:
            if start > at:
                self._parse(data[at:start], offset + at, out)
            self._by_line(data[start:end], offset + start, out)
            at = end
        if at < len(data):
            self._parse(data[at:], offset + at, out)

    def _halve(self, data: bytes, offset: int, out: _Out) -> None:
        """Parse the halves (at a line boundary): a bad line is isolated in ~log2(lines)."""
        cut = data.find(b"\n", len(data) // 2)
        if cut < 0 or cut + 1 >= len(data):
            cut = data.rfind(b"\n", 0, len(data) // 2)
        self._parse(data[: cut + 1], offset, out)
        self._parse(data[cut + 1 :], offset + cut + 1, out)

    def _fast(
        self, data: bytes, offset: int, lines: pa.Array, exact: list[int]
    ) -> tuple[pa.RecordBatch | None, list[tuple[int, int]], int | None]:
        """(rows, suspects, None) when ``data`` (its ``lines``, each ending with ``}``)
        parsed with one row per line: ``rows`` are the lines that passed every check and
        are not in ``exact`` (masked lines), ``suspects`` the byte ranges (in ``data``) of
        the others. Otherwise (None, [], index of a line known to fail, or None)."""
        if len(data) > self._limit and _longest(lines) > self._limit:
            return None, [], None  # an over-long line ("\r" of CRLF included: line by line)
        if not data.isascii():
            try:
                data.decode()
            except UnicodeDecodeError as exc:
                return None, [], data.count(b"\n", 0, exc.start)
            if b"\xef\xbb\xbf" in data:
                return None, [], None  # a byte order mark: Arrow skips a leading one, orjson fails
        table, failed_at = self._read(data, lines)
        if table is None:
            return None, [], failed_at
        if table.num_rows != len(lines):
            return None, [], None
        columns = [_array(column) for column in table.columns]
        bad, notes = self._checks.suspects(columns)
        if exact:
            flags = bytearray(len(lines))
            for index in exact:
                flags[index] = 1
            masked = pc.not_equal(_uint8(bytes(flags)), 0)
            bad = masked if bad is None else pc.or_(bad, masked)
        starts, ends = _bounds(lines, offset)
        suspects: list[tuple[int, int]] = []
        if bad is not None:
            indices = pc.indices_nonzero(bad)
            if len(indices):
                firsts, afters = starts.take(indices).to_pylist(), ends.take(indices).to_pylist()
                last = offset + len(data)
                suspects = [
                    (first - offset, min(after, last) - offset)
                    for first, after in zip(firsts, afters, strict=True)
                ]
                keep = pc.invert(bad)
                columns = [pc.filter(column, keep) for column in columns]
                starts = pc.filter(starts, keep)
        try:
            columns = self._checks.finish(columns, notes)
        except pa.ArrowInvalid:
            return None, [], None  # e.g. February 30th: found by halving, decided line by line
        rows = pa.RecordBatch.from_arrays([*columns, starts], schema=self._batch_schema)
        return rows, suspects, None

    def _read(self, data: bytes, lines: pa.Array) -> tuple[pa.Table | None, int | None]:
        """Arrow's parse of ``data``: (table, None), or (None, index of a line known to fail,
        or None). Extra fields are ignored only behind ``_lenient_ok``; once a block had
        some, later ones are parsed that way first (a hint: the result is the same)."""
        buffer = pa.py_buffer(data)
        if self._extra_fields and _lenient_ok(data, lines):
            try:
                return pj.read_json(buffer, read_options=_READ, parse_options=self._lenient), None
            except pa.ArrowInvalid as exc:
                return None, _failed_line(exc)
        try:
            return pj.read_json(buffer, read_options=_READ, parse_options=self._strict), None
        except pa.ArrowInvalid as exc:
            if "unexpected field" not in str(exc):
                return None, _failed_line(exc)
        self._extra_fields = True
        if not _lenient_ok(data, lines):
            return None, None
        try:
            return pj.read_json(buffer, read_options=_READ, parse_options=self._lenient), None
        except pa.ArrowInvalid as exc:
            return None, _failed_line(exc)

    def _by_line(self, data: bytes, offset: int, out: _Out) -> None:
        """The exact path: each line through ``parse_line``."""
        rows: list[tuple[Any, ...]] = []
        offsets: list[int] = []
        for at, content, truncated in lines_of(data, offset, self._limit):
            parsed = self.parse_line(content, truncated)
            if isinstance(parsed, str):
                out.dead.append((at, content, parsed))
            elif parsed is not None:
                rows.append(parsed)
                offsets.append(at)
        if rows:
            out.batches.append(self._converter.to_batch(rows, offsets))


def _array(column: pa.ChunkedArray) -> pa.Array:
    return column.chunk(0) if column.num_chunks == 1 else column.combine_chunks()


def _whole(data: bytes) -> pa.Array:
    """``data`` as a one-element binary array (no copy)."""
    offsets = pa.py_buffer(array("q", [0, len(data)]))
    return pa.Array.from_buffers(pa.large_binary(), 1, [None, offsets, pa.py_buffer(data)])


def _lines(data: bytes) -> pa.Array:
    """The lines of whole lines ``data`` (newlines excluded), split by Arrow."""
    parts = pc.split_pattern(_whole(data), "\n").values
    return parts.slice(0, len(parts) - 1) if data.endswith(b"\n") else parts


def _bounds(lines: pa.Array, offset: int) -> tuple[pa.Array, pa.Array]:
    """(first byte, first byte after the newline) of each line of ``lines``, which start at
    ``offset``: column-wise, no Python work per line."""
    sizes = pc.add(pc.binary_length(lines), 1)
    ends = pc.cumulative_sum(sizes, start=offset)
    return pc.subtract(ends, sizes), ends


def _uint8(data: bytes) -> pa.Array:
    return pa.Array.from_buffers(pa.uint8(), len(data), [None, pa.py_buffer(data)])


def _line_ranges(data: bytes, lines: pa.Array, indices: list[int]) -> list[tuple[int, int]]:
    """Byte ranges (newline included) of the ``lines`` of ``data`` at ``indices``."""
    starts, ends = _bounds(lines, 0)
    at = pa.array(indices, pa.int64())
    firsts, afters = starts.take(at).to_pylist(), ends.take(at).to_pylist()
    return [(first, min(after, len(data))) for first, after in zip(firsts, afters, strict=True)]


def _masked(data: bytes, lines: pa.Array, indices: list[int]) -> bytes | None:
    """``data`` with the ``lines`` at ``indices`` replaced by ``{`` spaces ``}`` of the same
    length (a row of nulls for Arrow; offsets unchanged), or None when one is shorter than
    two bytes."""
    copy = bytearray(data)
    for start, end in _line_ranges(data, lines, indices):
        size = end - start - (1 if copy[end - 1 : end] == b"\n" else 0)
        if size < 2:
            return None
        copy[start : start + size] = b"{" + b" " * (size - 2) + b"}"
    return bytes(copy)


def _longest(lines: pa.Array) -> int:
    longest = pc.max(pc.binary_length(lines)).as_py()
    return int(longest) if longest is not None else 0


def _failed_line(exc: pa.ArrowInvalid) -> int | None:
    row = _ROW.search(str(exc))
    return int(row.group(1)) if row else None


def _lenient_ok(data: bytes, lines: pa.Array) -> bool:
    """Ignored fields can hide nothing orjson rejects and Arrow accepts: ``NaN`` and
    ``Infinity``, numbers of 300 digits and more (too big for orjson), nesting deeper than
    orjson's limit of 1024 (which needs lines longer than ``_LENIENT_MAX_LINE``)."""
    if b"NaN" in data or b"Infinity" in data:
        return False
    longest = _longest(lines)
    if longest > _LENIENT_MAX_LINE:
        return False
    return longest < 300 or not pc.match_substring_regex(_whole(data), "[0-9]{300}")[0].as_py()
