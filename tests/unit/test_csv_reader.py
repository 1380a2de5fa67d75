"""CsvSplitReader, GzipLinesReader, LinesSplitReader and parse_csv_record.

The oracle is built from the generated rows themselves (offsets are summed while the file is
written, fields are kept before they are encoded), not by re-reading the file the way the reader
does.
"""

from __future__ import annotations

import csv
import gzip
import io
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from enumerator_service import FileSplit, SplitAssignment
from spark_jobs.source._csv_reader import (
    CsvHeaderError,
    CsvSplitReader,
    GzipLinesReader,
    LinesSplitReader,
    parse_csv_record,
)
from spark_jobs.source._events import Event
from spark_jobs.source._records import RawLine

BIG_LIMIT = 1 << 16
HEADER = ["id", "name, full", "note é"]
EVENT_COLUMNS = ["event_id", "user_id", "event_time", "event_type", "amount"]

Reader = CsvSplitReader | GzipLinesReader | LinesSplitReader


def encode_row(fields: list[str]) -> bytes:
    out = io.StringIO()
    csv.writer(out, lineterminator="\n").writerow(fields)
    return out.getvalue().removesuffix("\n").encode()


@dataclass(frozen=True)
class Row:
    fields: list[str] | None  # None: a blank line
    eol: bytes  # b"\n", b"\r\n", or b"" for a last line without a newline

    @property
    def content(self) -> bytes:
        return b"" if self.fields is None else encode_row(self.fields)


@dataclass(frozen=True)
class Expected:
    offset: int
    next_offset: int
    content: bytes
    fields: list[str] | None


def build(
    header: list[str], rows: list[Row], header_eol: bytes = b"\n"
) -> tuple[bytes, list[Expected]]:
    """The file bytes and, per data row, where it lies and what it holds."""
    data = encode_row(header) + header_eol
    expected: list[Expected] = []
    for row in rows:
        offset = len(data)
        data += row.content + row.eol
        expected.append(Expected(offset, len(data), row.content, row.fields))
    return data, expected


def raw(expected: list[Expected], limit: int = BIG_LIMIT) -> list[RawLine]:
    return [
        RawLine(e.offset, e.next_offset, e.content[:limit], len(e.content) > limit)
        for e in expected
    ]


@contextmanager
def data_file(data: bytes, name: str = "part-0.csv", *, gz: bool = False) -> Iterator[str]:
    with tempfile.TemporaryDirectory() as directory:
        path = os.path.join(directory, name)
        Path(path).write_bytes(gzip.compress(data) if gz else data)
        yield path


def assignment(
    split_id: int,
    path: str,
    start: int,
    end: int | None,
    resume: int | None = None,
    kind: str = "csv",
) -> SplitAssignment:
    split = FileSplit("events", kind, path, start, end, None)
    return SplitAssignment(
        split_id, split, epoch=1, resume_offset=start if resume is None else resume
    )


def drain(reader: Reader, assignments: list[SplitAssignment]) -> dict[int, list[RawLine]]:
    """Lines per split id; checks every split finishes exactly once, in assignment order."""
    for a in assignments:
        reader.add_split(a)
    lines: dict[int, list[RawLine]] = {a.split_id: [] for a in assignments}
    finished: list[int] = []
    budget = 10 + sum(os.path.getsize(a.split.path) * 20 + 2 for a in assignments)
    try:
        while reader.has_splits():
            budget -= 1
            assert budget > 0, "reader makes no progress"
            batch = reader.fetch()
            for split_id, records in batch.records.items():
                assert split_id not in finished, f"lines for split {split_id} after it finished"
                lines[split_id].extend(records)
            finished.extend(batch.finished)
    finally:
        reader.close()
    assert finished == [a.split_id for a in assignments]
    return lines


def read_csv(
    path: str,
    start: int,
    end: int | None,
    resume: int | None = None,
    *,
    chunk: int,
    kind: str = "csv",
    limit: int = BIG_LIMIT,
) -> list[RawLine]:
    reader = CsvSplitReader(max_line_bytes=limit, chunk_bytes=chunk)
    return drain(reader, [assignment(7, path, start, end, resume, kind)])[7]


def fields_of(line: RawLine) -> list[str] | None:
    """The fields of a data line as parse_csv_record sees them (None for a blank line)."""
    if not line.data.strip():
        return None
    return next(csv.reader([line.data.decode()], strict=True))


# -- strategies ------------------------------------------------------------------------------

field_strategy = st.text(alphabet='ab,"é漢 ', max_size=6)
eol_strategy = st.sampled_from([b"\n", b"\r\n"])


@st.composite
def csv_rows(draw: st.DrawFn, width: int = 3, max_rows: int = 8) -> list[Row]:
    fields = st.lists(field_strategy, min_size=width, max_size=width)
    rows = draw(
        st.lists(st.builds(Row, st.one_of(fields, st.none()), eol_strategy), max_size=max_rows)
    )
    if rows and rows[-1].fields is not None and draw(st.booleans()):
        rows[-1] = Row(rows[-1].fields, b"")  # last row without a trailing newline
    return rows


PROPERTY_SETTINGS = settings(database=None, deadline=None, max_examples=150)


# -- properties ------------------------------------------------------------------------------


@PROPERTY_SETTINGS
@given(rows=csv_rows(), header_eol=eol_strategy, data=st.data(), chunk=st.integers(1, 16))
def test_splits_yield_every_data_row_exactly_once(
    rows: list[Row], header_eol: bytes, data: st.DataObject, chunk: int
) -> None:
    file_bytes, expected = build(HEADER, rows, header_eol)
    size = len(file_bytes)
    cuts = sorted(data.draw(st.lists(st.integers(0, size), max_size=5), label="cuts"))
    last_end = data.draw(st.sampled_from([None, size]), label="last end")
    bounds: list[tuple[int, int | None]] = list(zip([0, *cuts], [*cuts, last_end], strict=True))
    reader = CsvSplitReader(max_line_bytes=BIG_LIMIT, chunk_bytes=chunk)
    with data_file(file_bytes) as path:
        split_lines = drain(reader, [assignment(i, path, s, e) for i, (s, e) in enumerate(bounds)])
    for i, (start, end) in enumerate(bounds):
        owned = [x for x in expected if start <= x.offset and (end is None or x.offset < end)]
        assert split_lines[i] == raw(owned), f"split {i} = [{start}, {end})"
        assert reader.header_of(i) == HEADER
    union = [line for i in range(len(bounds)) for line in split_lines[i]]
    assert union == raw(expected)  # every data row once, in file order; never the header
    assert [fields_of(line) for line in union] == [x.fields for x in expected]


@PROPERTY_SETTINGS
@given(rows=csv_rows(), gz=st.booleans(), chunk=st.integers(1, 16))
def test_resume_from_any_next_offset_yields_exactly_the_remaining_rows(
    rows: list[Row], gz: bool, chunk: int
) -> None:
    file_bytes, expected = build(HEADER, rows)
    kind = "csv.gz" if gz else "csv"
    with data_file(file_bytes, gz=gz) as path:
        emitted = read_csv(path, 0, None, chunk=chunk, kind=kind)
        assert emitted == raw(expected)
        for i, line in enumerate(emitted):
            resumed = read_csv(path, 0, None, resume=line.next_offset, chunk=chunk, kind=kind)
            assert resumed == emitted[i + 1 :], f"resume from {line.next_offset}"


@PROPERTY_SETTINGS
@given(rows=csv_rows(), data=st.data(), chunk=st.integers(1, 16))
def test_resume_inside_a_mid_file_split(rows: list[Row], data: st.DataObject, chunk: int) -> None:
    file_bytes, expected = build(HEADER, rows)
    size = len(file_bytes)
    start = data.draw(st.integers(0, size), label="start")
    end = data.draw(st.integers(start, size), label="end")
    with data_file(file_bytes) as path:
        emitted = read_csv(path, start, end, chunk=chunk)
        assert emitted == raw([x for x in expected if start <= x.offset < end])
        for i, line in enumerate(emitted):
            resumed = read_csv(path, start, end, resume=line.next_offset, chunk=chunk)
            assert resumed == emitted[i + 1 :], f"resume from {line.next_offset}"


@PROPERTY_SETTINGS
@given(rows=csv_rows(), limit=st.integers(1, 12), chunk=st.integers(1, 16))
def test_gzip_lines_match_the_plain_file_reader(rows: list[Row], limit: int, chunk: int) -> None:
    """Same lines, offsets and truncation as JSON Lines byte ranges, whatever the chunk size."""
    file_bytes, expected = build(["h"], rows)
    every_line = [Expected(0, 2, b"h", None), *expected]  # a line reader has no header
    with (
        data_file(file_bytes, "a.jsonl") as plain,
        data_file(file_bytes, "a.jsonl.gz", gz=True) as gz,
    ):
        reader = LinesSplitReader(max_line_bytes=limit, chunk_bytes=chunk)
        lines = drain(
            reader,
            [
                assignment(1, plain, 0, None, kind="jsonl"),
                assignment(2, gz, 0, None, kind="jsonl.gz"),
            ],
        )
        alone = drain(
            GzipLinesReader(max_line_bytes=limit, chunk_bytes=chunk),
            [assignment(3, gz, 0, None, kind="jsonl.gz")],
        )
    assert lines[1] == lines[2] == alone[3] == raw(every_line, limit)


@st.composite
def events(draw: st.DrawFn) -> tuple[dict[str, str], Event]:
    text = st.text(alphabet='ab,"é漢 -', min_size=1, max_size=8).filter(str.strip)
    event_id, event_type = draw(text), draw(text)
    user_id = draw(st.integers(-(2**63), 2**63 - 1))
    when = datetime(2026, 1, 1, tzinfo=UTC) + timedelta(microseconds=draw(st.integers(0, 10**13)))
    amount = draw(st.floats(allow_nan=False, allow_infinity=False))
    fields = {
        "event_id": event_id,
        "user_id": str(user_id),
        "event_time": when.isoformat(),
        "event_type": event_type,
        "amount": repr(amount),
    }
    return fields, Event(5, event_id, user_id, when, event_type, amount)


@PROPERTY_SETTINGS
@given(
    generated=st.lists(events(), max_size=6),
    columns=st.permutations(EVENT_COLUMNS),
    gz=st.booleans(),
    chunk=st.integers(1, 64),
)
def test_parse_csv_record_round_trips_events(
    generated: list[tuple[dict[str, str], Event]], columns: list[str], gz: bool, chunk: int
) -> None:
    file_bytes, _ = build(
        columns, [Row([fields[c] for c in columns], b"\r\n") for fields, _ in generated]
    )
    kind = "csv.gz" if gz else "csv"
    reader = CsvSplitReader(max_line_bytes=BIG_LIMIT, chunk_bytes=chunk)
    with data_file(file_bytes, gz=gz) as path:
        lines = drain(reader, [assignment(5, path, 0, None, kind=kind)])[5]
    header = reader.header_of(5)
    assert header == columns
    parsed = [parse_csv_record(5, header, line, BIG_LIMIT) for line in lines]
    assert parsed == [event for _, event in generated]


# -- malformed rows --------------------------------------------------------------------------

GOOD = ["e1", "42", "2026-01-01T00:00:00+00:00", "click", "1.5"]


def parse_line(content: bytes, *, truncated: bool = False) -> Event | str | None:
    return parse_csv_record(3, EVENT_COLUMNS, RawLine(10, 20, content, truncated), 100)


def with_field(index: int, value: str) -> bytes:
    return encode_row([value if i == index else v for i, v in enumerate(GOOD)])


def test_good_row_parses() -> None:
    when = datetime(2026, 1, 1, tzinfo=UTC)
    assert parse_line(encode_row(GOOD)) == Event(3, "e1", 42, when, "click", 1.5)
    assert parse_line(with_field(2, "2026-01-01T00:00:00")) == Event(
        3, "e1", 42, when, "click", 1.5
    )
    assert parse_line(with_field(1, " 42 ")) == Event(3, "e1", 42, when, "click", 1.5)


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        (b"e1,42,2026-01-01T00:00:00Z,click", "bad value: expected 5 fields, got 4"),
        (encode_row([*GOOD, "extra"]), "bad value: expected 5 fields, got 6"),
        (with_field(1, "forty-two"), "wrong type: user_id must be an integer, got 'forty-two'"),
        (with_field(1, "4.2"), "wrong type: user_id must be an integer, got '4.2'"),
        (with_field(1, str(2**63)), f"bad value: user_id '{2**63}' is outside the int64 range"),
        (with_field(4, "a lot"), "wrong type: amount must be a number, got 'a lot'"),
        (with_field(4, "nan"), "bad value: amount 'nan' is not finite"),
        (with_field(0, ""), "missing field: event_id"),
        (b",,,,", "missing field: event_id, user_id, event_time, event_type, amount"),
        (with_field(2, "yesterday"), "bad value: event_time 'yesterday' is not ISO-8601"),
        (
            encode_row(GOOD).replace(b"click", b"cl\xffck"),
            "invalid UTF-8: line is not valid UTF-8 text",
        ),
        (
            b'e1,42,2026-01-01T00:00:00Z,"cli',
            "invalid CSV: unbalanced quotes (quoted fields spanning lines are not supported)",
        ),
        (
            b'ck",1.5',
            "invalid CSV: unbalanced quotes (quoted fields spanning lines are not supported)",
        ),
        (b'e1,42,2026-01-01T00:00:00Z,"click"x,1.5', "invalid CSV: ',' expected after '\"'"),
    ],
)
def test_malformed_rows_give_their_reason(content: bytes, reason: str) -> None:
    assert parse_line(content) == reason


def test_truncated_and_blank_lines() -> None:
    assert parse_line(b"e1,4", truncated=True) == "line too long: over 100 bytes"
    assert parse_line(b"") is None
    assert parse_line(b"  ") is None


def test_quoted_newline_is_reported_not_silently_split() -> None:
    """A quoted field spanning lines comes out as malformed pieces, never as a wrong event."""
    head = encode_row(EVENT_COLUMNS)
    body = b'e1,42,2026-01-01T00:00:00Z,"two\nlines",1.5\n' + encode_row(GOOD) + b"\n"
    with data_file(head + b"\n" + body) as path:
        lines = read_csv(path, 0, None, chunk=7)
    parsed = [parse_csv_record(3, EVENT_COLUMNS, line, BIG_LIMIT) for line in lines]
    assert (
        parsed[0]
        == parsed[1]
        == ("invalid CSV: unbalanced quotes (quoted fields spanning lines are not supported)")
    )
    assert isinstance(parsed[2], Event)


# -- headers ---------------------------------------------------------------------------------


def test_header_with_bom_and_crlf_and_a_split_starting_inside_it() -> None:
    data = b"\xef\xbb\xbfevent_id , user_id\r\nx,1\r\ny,2\r\n"
    with data_file(data) as path:
        reader = CsvSplitReader(max_line_bytes=BIG_LIMIT, chunk_bytes=4)
        lines = drain(reader, [assignment(1, path, 0, 5), assignment(2, path, 5, None)])
    assert reader.header_of(1) == reader.header_of(2) == ["event_id", "user_id"]
    assert lines[1] == []
    assert lines[2] == [RawLine(23, 28, b"x,1"), RawLine(28, 33, b"y,2")]
    reader.release(1)
    with pytest.raises(KeyError):
        reader.header_of(1)


@pytest.mark.parametrize("data", [b"", b"a,b", b"a,b\n", b"a,b\r\n"])
def test_empty_and_header_only_files_have_no_records(data: bytes) -> None:
    with data_file(data) as path:
        assert read_csv(path, 0, None, chunk=1) == []


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"abcdefghijk\nx\n", "header line longer than 10 bytes"),
        (b"\n1\n", "empty header line"),
        (b"a,a\n1,2\n", "duplicate column names"),
        (b"a,\xff\n1,2\n", "unreadable header line"),
        (b'a,"b\n1,2\n', "unreadable header line"),
    ],
)
def test_unusable_header_fails_the_split(data: bytes, message: str) -> None:
    with data_file(data) as path, pytest.raises(CsvHeaderError, match=message):
        read_csv(path, 2, None, chunk=4, limit=10)


def test_header_of_exactly_the_limit_with_crlf_is_accepted() -> None:
    with data_file(b"abc\r\n1\n") as path:
        reader = CsvSplitReader(max_line_bytes=3)
        assert drain(reader, [assignment(1, path, 0, None)])[1] == [RawLine(5, 7, b"1")]
        assert reader.header_of(1) == ["abc"]


# -- gzip ------------------------------------------------------------------------------------


def test_gzip_file_read_as_one_split_yields_all_rows() -> None:
    rows = [Row(["r", str(i), "漢" * (i % 4)], b"\n") for i in range(500)]
    file_bytes, expected = build(HEADER, rows)
    with data_file(file_bytes, "part-0.csv.gz", gz=True) as path:
        lines = read_csv(path, 0, None, chunk=1000, kind="csv.gz")
    assert lines == raw(expected)
    assert [fields_of(line) for line in lines] == [x.fields for x in expected]


@pytest.mark.parametrize("bounds", [(0, 100), (5, None)])
def test_gzip_split_must_cover_the_whole_file(bounds: tuple[int, int | None]) -> None:
    split = assignment(1, "unused.csv.gz", bounds[0], bounds[1], kind="csv.gz")
    with pytest.raises(ValueError, match="must cover the whole file"):
        CsvSplitReader(max_line_bytes=10).add_split(split)
    with pytest.raises(ValueError, match="must cover the whole file"):
        GzipLinesReader(max_line_bytes=10).add_split(split)


def test_corrupt_gzip_fails_the_split() -> None:
    good = gzip.compress(b"a,b\n" + b"1,2\n" * 1000)
    with data_file(b"") as empty:
        path = empty + ".gz"
        Path(path).write_bytes(good[: len(good) // 2])  # truncated stream
        with pytest.raises(EOFError):
            drain(
                GzipLinesReader(max_line_bytes=100), [assignment(1, path, 0, None, kind="csv.gz")]
            )


def test_wake_up_and_fetch_without_splits() -> None:
    for reader in (CsvSplitReader(max_line_bytes=10), GzipLinesReader(max_line_bytes=10)):
        reader.wake_up()
        batch = reader.fetch()
        assert not batch.records and not batch.finished
        assert not reader.has_splits()
        reader.close()


def read_gzip_lines(data: bytes, *, chunk: int, limit: int) -> list[RawLine]:
    with data_file(data, "part-0.jsonl.gz", gz=True) as path:
        reader = GzipLinesReader(max_line_bytes=limit, chunk_bytes=chunk)
        return drain(reader, [assignment(1, path, 0, None, kind="jsonl.gz")])[1]


@pytest.mark.parametrize("chunk", [1, 2, 3, 4, 5, 6, 64])
def test_gzip_crlf_line_of_exactly_the_limit_is_not_truncated(chunk: int) -> None:
    out = read_gzip_lines(b"abc\r\nxy\n", chunk=chunk, limit=3)
    assert out == [RawLine(0, 5, b"abc", False), RawLine(5, 8, b"xy", False)]


@pytest.mark.parametrize("chunk", [1, 3, 8, 13, 64, 1 << 20])
def test_gzip_over_long_lines_are_truncated_and_following_lines_intact(chunk: int) -> None:
    data = b"a,1\n" + b"x" * 40 + b"\nb,2\r\n" + "漢".encode() * 5 + b"\r\n\nc,3\n" + b"z" * 30
    out = read_gzip_lines(data, chunk=chunk, limit=8)
    assert out == [
        RawLine(0, 4, b"a,1"),
        RawLine(4, 45, b"x" * 8, True),
        RawLine(45, 50, b"b,2"),
        RawLine(50, 67, "漢".encode() * 2 + "漢".encode()[:2], True),
        RawLine(67, 68, b""),
        RawLine(68, 72, b"c,3"),
        RawLine(72, 102, b"z" * 8, True),
    ]
