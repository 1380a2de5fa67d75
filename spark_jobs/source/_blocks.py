"""Event blocks: a run of whole JSON Lines of one split, parsed at once into Arrow columns.

Per-record Python work (one JSON object, one validated ``Event``, one ``datetime`` per line)
dominated a reader subtask's CPU. A block is parsed by Arrow's JSON reader in one call and
validated column-wise. The result must be exactly what :func:`parse_event` (orjson, then
:func:`validate_event`) gives line by line, so the fast path only accepts a piece of input
it can prove is handled identically; anything else is cut in halves until the pieces are
small, and the lines of a small piece take the exact per-line path:

- every line ends with ``}`` (so none is blank or whitespace, the lines Arrow skips, and
  each yields at least one row; with "rows == lines" each line is exactly one row — Arrow
  reads ``{…} {…}`` as two, which would shift rows against line offsets). Lines that do
  not are few in practice (truncated writes): they go line by line straight away;
- the text is valid UTF-8 without a byte order mark (Arrow checks neither; orjson does);
- Arrow accepted it with unexpected fields an *error*: only the five event fields are
  parsed, so grammar differences in other fields (``NaN``, numbers too big for a double,
  nesting beyond orjson's depth limit — Arrow accepts all three) cannot occur. A block with
  extra fields is parsed again with them ignored, behind checks for exactly those cases;
- no nulls (missing field), no empty ``event_id``, finite ``amount`` (Arrow reads ``NaN``),
  ``event_time`` in a strict ISO-8601 form on which Arrow's cast and
  ``datetime.fromisoformat`` agree (values without an offset are UTC in both);
- no line is longer than the reader's limit (those are dead-lettered as too long).

Type mismatches (``user_id`` 1.0, ``true``, ``"5"``; ``amount`` ``"x"``) make Arrow fail the
piece, which then goes the exact way and gets the exact dead-letter reason.

Threading: pure functions; called on the fetcher thread (and the lookup's loader thread).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from itertools import accumulate
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pj

from spark_jobs.source._events import Event, parse_event
from spark_jobs.source._records import RawLine

__all__ = ["EVENT_SCHEMA", "EventBlock", "concat", "events_to_batch", "max_time", "parse_lines"]

EVENT_SCHEMA = pa.schema(
    [
        pa.field("event_id", pa.string(), nullable=False),
        pa.field("user_id", pa.int64(), nullable=False),
        pa.field("event_time", pa.timestamp("us", tz="UTC"), nullable=False),
        pa.field("event_type", pa.string(), nullable=False),
        pa.field("amount", pa.float64(), nullable=False),
    ]
)
_JSON_SCHEMA = pa.schema(
    [
        ("event_id", pa.string()),
        ("user_id", pa.int64()),
        ("event_time", pa.string()),  # cast after a format check, see _times
        ("event_type", pa.string()),
        ("amount", pa.float64()),
    ]
)
_STRICT = pj.ParseOptions(explicit_schema=_JSON_SCHEMA, unexpected_field_behavior="error")
_LENIENT = pj.ParseOptions(explicit_schema=_JSON_SCHEMA, unexpected_field_behavior="ignore")
_READ = pj.ReadOptions(use_threads=False, block_size=1 << 24)
_TIME = (
    r"^([1-8][0-9]{3}|9[0-8][0-9]{2})-[0-9]{2}-[0-9]{2}"
    r"[T ]([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\.[0-9]{1,6})?"
    r"(Z|[+-]([01][0-9]|2[0-3]):[0-5][0-9])?$"
)
_ZONED_TIME = _TIME.removesuffix(")?$") + ")$"  # the same, with the offset required
_OFFSET = r"(Z|[+-][0-9]{2}:[0-9]{2})$"
# (Years 1000-9899 only: near year 1 or 9999 an offset can leave Python's datetime range,
# which Arrow's does not mind; such times are decided line by line.)
_UTC = pa.timestamp("us", tz="UTC")
#: Pieces of at most this many lines that the fast path rejects are parsed line by line.
_SMALL = 8
#: With ignored fields: longer lines go line by line (orjson's depth limit of 1024 needs more
#: than 2048 bytes of brackets, which Arrow would accept).
_LENIENT_MAX_LINE = 2048
_INT64 = (-(1 << 63), (1 << 63) - 1)


@dataclass(slots=True)
class EventBlock:
    """Whole lines ``[start, end)`` of split ``split_id``, parsed.

    ``rows`` holds the well-formed events in line order (:data:`EVENT_SCHEMA`); ``dead`` the
    malformed lines as (offset, raw bytes, reason), one per line, in line order. ``end`` is
    the offset after the block's last line: the split's offset once the block is emitted.
    """

    split_id: int
    start: int
    end: int
    rows: pa.RecordBatch
    dead: list[tuple[int, bytes, str]]
    max_event_time: datetime | None

    @property
    def next_offset(self) -> int:
        return self.end


def events_to_batch(events: list[Event]) -> tuple[pa.RecordBatch, list[int]]:
    """Events as an Arrow batch; also the indices of events Arrow cannot hold (a ``user_id``
    beyond 64 bits, an event time outside Arrow's range), which are left out."""
    bad: list[int] = []
    kept = events
    for i, event in enumerate(events):
        if not _INT64[0] <= event.user_id <= _INT64[1] or not _fits(event.event_time):
            bad.append(i)
    if bad:
        skip = set(bad)
        kept = [e for i, e in enumerate(events) if i not in skip]
    columns = list(zip(*kept, strict=True)) if kept else [()] * 6
    arrays = [pa.array(columns[i + 1], type=field.type) for i, field in enumerate(EVENT_SCHEMA)]
    return pa.RecordBatch.from_arrays(arrays, schema=EVENT_SCHEMA), bad


def _fits(when: datetime) -> bool:
    try:
        when.astimezone(UTC)
    except OverflowError:
        return False
    return True


def parse_lines(
    split_id: int, data: bytes, offset: int, max_line_bytes: int
) -> tuple[list[pa.RecordBatch], list[tuple[int, bytes, str]]]:
    """Parse whole lines ``data`` (starting at file offset ``offset``; the last one may lack
    its newline at the end of a file): the events as batches in line order, and dead letters.
    """
    batches: list[pa.RecordBatch] = []
    dead: list[tuple[int, bytes, str]] = []
    if data:
        _parse(split_id, data, offset, max_line_bytes, batches, dead)
    return batches, dead


def _parse(
    split_id: int,
    data: bytes,
    offset: int,
    limit: int,
    batches: list[pa.RecordBatch],
    dead: list[tuple[int, bytes, str]],
) -> None:
    newlines = data.count(b"\n")
    lines = newlines if data.endswith(b"\n") else newlines + 1
    closed = data.count(b"}\n")
    if closed != newlines:
        closed += data.count(b"}\r\n")
    if lines != closed + (
        0 if data.endswith(b"\n") or not data.rstrip(b"\r").endswith(b"}") else 1
    ):
        # Some line does not end with "}" (truncated, blank, not an object): such lines take
        # the exact path at once and the runs between them the fast one (Arrow would fail
        # at each, and the failed parse be wasted); too many: halve first.
        if lines <= _SMALL:
            _by_line(split_id, data, offset, limit, batches, dead)
            return
        if lines - closed <= _SMALL:
            _exact_around(split_id, data, offset, limit, batches, dead, _torn_lines(data))
            return
        _halve(split_id, data, offset, limit, batches, dead)
        return
    rows, suspects, failed_at = _fast(data, limit, lines)
    if rows is not None:
        batches.append(rows)
        if suspects:  # rows that failed a column check: decided line by line
            for start, end in _line_ranges(data, suspects):
                _by_line(split_id, data[start:end], offset + start, limit, batches, dead)
        return
    if failed_at is not None and 0 <= failed_at < lines:
        # The line that failed is known (a hint: every piece is still checked in full).
        start = len(data) - len(data.split(b"\n", failed_at)[-1])
        end = data.find(b"\n", start) + 1 or len(data)
        _exact_around(split_id, data, offset, limit, batches, dead, [(start, end)])
        return
    if lines <= _SMALL:
        _by_line(split_id, data, offset, limit, batches, dead)
        return
    _halve(split_id, data, offset, limit, batches, dead)


def _exact_around(
    split_id: int,
    data: bytes,
    offset: int,
    limit: int,
    batches: list[pa.RecordBatch],
    dead: list[tuple[int, bytes, str]],
    exact: Iterable[tuple[int, int]],
) -> None:
    """The line ranges ``exact`` (ascending, disjoint) line by line, the runs between them
    through ``_parse`` again; output in line order."""
    at = 0
    for start, end in exact:
        if start > at:
            _parse(split_id, data[at:start], offset + at, limit, batches, dead)
        _by_line(split_id, data[start:end], offset + start, limit, batches, dead)
        at = end
    if at < len(data):
        _parse(split_id, data[at:], offset + at, limit, batches, dead)


def _halve(
    split_id: int,
    data: bytes,
    offset: int,
    limit: int,
    batches: list[pa.RecordBatch],
    dead: list[tuple[int, bytes, str]],
) -> None:
    """Parse the halves (at a line boundary): a bad line is isolated in ~log2(lines) parses."""
    cut = data.find(b"\n", len(data) // 2)
    if cut < 0 or cut + 1 >= len(data):
        cut = data.rfind(b"\n", 0, len(data) // 2)
    _parse(split_id, data[: cut + 1], offset, limit, batches, dead)
    _parse(split_id, data[cut + 1 :], offset + cut + 1, limit, batches, dead)


_ROW = re.compile(r" in row (\d+)$")


def _torn_lines(data: bytes) -> list[tuple[int, int]]:
    """Byte ranges of the lines of ``data`` that do not end with ``}``."""
    lines = data.split(b"\n")
    if data.endswith(b"\n"):
        lines.pop()
    torn = [i for i, line in enumerate(lines) if line[-1:] != b"}" and line[-2:] != b"}\r"]
    return _line_ranges(data, torn, lines)


def _line_ranges(
    data: bytes, indices: list[int], lines: list[bytes] | None = None
) -> list[tuple[int, int]]:
    """Byte ranges (newline included) of the lines ``indices`` (ascending) of ``data``."""
    if lines is None:
        lines = data.split(b"\n")
    ends = list(accumulate(map(len, lines)))  # C loops: no Python work per line
    out = []
    for i in indices:
        start = ends[i - 1] + i if i else 0  # + one newline per line before
        out.append((start, min(ends[i] + i + 1, len(data))))
    return out


def _fast(
    data: bytes, limit: int, lines: int
) -> tuple[pa.RecordBatch | None, list[int], int | None]:
    """(rows, suspects, None) when ``data`` (``lines`` lines, each ending with ``}``) parsed
    with one row per line: ``rows`` are the lines that passed every check, ``suspects`` the
    indices of lines that did not (they take the per-line path). Otherwise (None, [], index
    of a line known to fail, or None)."""
    if len(data) > limit and max(map(len, data.split(b"\n"))) > limit:
        return None, [], None  # an over-long line ("\r" of CRLF included: then line by line)
    if not data.isascii():
        try:
            data.decode()
        except UnicodeDecodeError as exc:
            return None, [], data.count(b"\n", 0, exc.start)
        if b"\xef\xbb\xbf" in data:
            return None, [], None  # a byte order mark: Arrow skips a leading one, orjson fails
    buffer = pa.py_buffer(data)
    try:
        table = pj.read_json(buffer, read_options=_READ, parse_options=_STRICT)
    except pa.ArrowInvalid as exc:
        message = str(exc)
        if "unexpected field" not in message:
            row = _ROW.search(message)
            return None, [], int(row.group(1)) if row else None
        if b"NaN" in data or b"Infinity" in data or not _lenient_ok(data):
            return None, [], None
        try:  # extra fields: ignore them (behind the checks above)
            table = pj.read_json(buffer, read_options=_READ, parse_options=_LENIENT)
        except pa.ArrowInvalid as again:
            row = _ROW.search(str(again))
            return None, [], int(row.group(1)) if row else None
    if table.num_rows != lines:
        return None, [], None
    return _validated(table)


def _lenient_ok(data: bytes) -> bool:
    """Ignored fields hide no number orjson rejects as too big and no deep nesting."""
    longest = max(map(len, data.split(b"\n")))
    if longest > _LENIENT_MAX_LINE:
        return False
    digits = pc.match_substring_regex(pa.array([data], pa.large_binary()), "[0-9]{300}")
    return not digits[0].as_py()


def _validated(table: pa.Table) -> tuple[pa.RecordBatch | None, list[int], int | None]:
    event_id, user_id, when, event_type, amount = columns = table.combine_chunks().columns
    # Each check is an aggregate first; a mask of failing rows is built only when one fails.
    failed: list[pa.Array] = []
    if any(column.null_count for column in columns):  # a missing (or null) field
        failed.append(pc.invert(_all_valid(columns)))
    lengths = pc.binary_length(event_id)
    if pc.min(lengths).as_py() == 0:
        failed.append(pc.equal(lengths, 0))
    finite = pc.is_finite(amount)  # Arrow reads NaN, orjson does not
    if not pc.all(finite).as_py():
        failed.append(pc.invert(finite))
    zoned = pc.match_substring_regex(when, _ZONED_TIME)  # the usual form: one regex
    naive = False
    if not pc.all(zoned).as_py():
        failed.append(pc.invert(pc.match_substring_regex(when, _TIME)))
        naive = True
    suspects: list[int] = []
    if failed:
        bad = failed[0]
        for more in failed[1:]:
            bad = pc.or_kleene(bad, more)
        bad = pc.fill_null(bad, True)
        suspects = pc.indices_nonzero(bad).to_pylist()
        if suspects:
            ok = pc.invert(bad)
            keep = pc.filter
            event_id, user_id, when = keep(event_id, ok), keep(user_id, ok), keep(when, ok)
            event_type, amount = keep(event_type, ok), keep(amount, ok)
    if naive:
        with_offset = pc.match_substring_regex(when, _OFFSET)
        # No offset means UTC (as in validate_event); Arrow needs one to cast to UTC.
        when = pc.if_else(with_offset, when, pc.binary_join_element_wise(when, "+00:00", ""))
    try:
        times = pc.cast(when, _UTC)
    except pa.ArrowInvalid:
        return None, [], None  # e.g. February 30th: found by halving, decided line by line
    rows = pa.RecordBatch.from_arrays(
        [_chunk(event_id), _chunk(user_id), _chunk(times), _chunk(event_type), _chunk(amount)],
        schema=EVENT_SCHEMA,
    )
    return rows, suspects, None


def _all_valid(columns: list[Any]) -> pa.Array:
    valid = pc.is_valid(columns[0])
    for column in columns[1:]:
        valid = pc.and_(valid, pc.is_valid(column))
    return valid


def _chunk(column: Any) -> pa.Array:
    return column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column


def _by_line(
    split_id: int,
    data: bytes,
    offset: int,
    limit: int,
    batches: list[pa.RecordBatch],
    dead: list[tuple[int, bytes, str]],
) -> None:
    """The exact path: each line as the per-record reader and parse_event see it."""
    events: list[Event] = []
    raws: list[RawLine] = []
    at = offset
    for text in data.split(b"\n"):
        following = at + len(text) + 1
        if following > offset + len(data):  # the last line, without a newline
            following = offset + len(data)
            if not text:
                break
        content = text.removesuffix(b"\r")
        line = RawLine(at, following, content[:limit], len(content) > limit)
        parsed = parse_event(split_id, line, limit)
        if isinstance(parsed, str):
            dead.append((at, line.data, parsed))
        elif parsed is not None:
            events.append(parsed)
            raws.append(line)
        at = following
    if not events:
        return
    batch, unfit = events_to_batch(events)
    for i in unfit:
        reason = "bad value: user_id or event_time out of range"
        dead.append((raws[i].offset, raws[i].data, reason))
    if unfit:
        dead.sort(key=lambda entry: entry[0])
    batches.append(batch)


def concat(batches: list[pa.RecordBatch]) -> pa.RecordBatch:
    """One batch of ``batches`` (the schema's empty batch for none)."""
    if not batches:
        return _empty()
    if len(batches) == 1:
        return batches[0]
    return pa.concat_batches(batches)


def _empty() -> pa.RecordBatch:
    return pa.RecordBatch.from_arrays(
        [pa.array([], type=field.type) for field in EVENT_SCHEMA], schema=EVENT_SCHEMA
    )


def max_time(rows: pa.RecordBatch) -> datetime | None:
    """The largest event time of ``rows`` (None for no rows)."""
    if not rows.num_rows:
        return None
    value: Any = pc.max(rows.column(2)).as_py()
    return value if isinstance(value, datetime) else None
