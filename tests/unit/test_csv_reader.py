"""LineSplitReader on CSV (plain and gzip) and gzip JSON Lines, and CsvLinesParser.

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
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from source_schemas import EVENT_FIELDS, EVENTS, ORDERS, file_assignment, read_blocks

from spark_jobs.source import (
    OFFSET,
    CsvHeaderError,
    CsvLinesParser,
    FormatRouter,
    LineSplitReader,
    ParsedBlock,
    RecordConverter,
    RecordSchema,
    SplitRead,
)

BIG_LIMIT = 1 << 16
HEADER = ["id", "name", "note"]
TEXTS = RecordSchema(tuple(pa.field(name, pa.string()) for name in HEADER))
UNBALANCED = "invalid CSV: unbalanced quotes (quoted fields spanning lines are not supported)"


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


def text_rows(expected: list[Expected]) -> list[dict[str, Any]]:
    """What TEXTS reads from these rows: the non-blank ones, empty fields null."""
    return [
        {**{n: v or None for n, v in zip(HEADER, x.fields, strict=True)}, OFFSET: x.offset}
        for x in expected
        if x.fields is not None
    ]


@contextmanager
def data_file(data: bytes, name: str = "part-0.csv", *, gz: bool = False) -> Iterator[str]:
    with tempfile.TemporaryDirectory() as directory:
        path = os.path.join(directory, name)
        Path(path).write_bytes(gzip.compress(data) if gz else data)
        yield path


def read_csv(
    path: str,
    start: int,
    end: int | None,
    resume: int | None = None,
    *,
    chunk: int,
    kind: str = "csv",
    limit: int = BIG_LIMIT,
    schema: RecordSchema = TEXTS,
) -> list[ParsedBlock]:
    reader = LineSplitReader(schema, max_line_bytes=limit, chunk_bytes=chunk)
    read = SplitRead.of(file_assignment(7, path, start, end, resume, kind=kind))
    return read_blocks(reader, read)


def rows(blocks: list[ParsedBlock]) -> list[dict[str, Any]]:
    return [row for block in blocks for row in block.rows.to_pylist()]


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
@given(rows_=csv_rows(), header_eol=eol_strategy, data=st.data(), chunk=st.integers(1, 16))
def test_splits_yield_every_data_row_exactly_once(
    rows_: list[Row], header_eol: bytes, data: st.DataObject, chunk: int
) -> None:
    file_bytes, expected = build(HEADER, rows_, header_eol)
    size = len(file_bytes)
    cuts = sorted(data.draw(st.lists(st.integers(0, size), max_size=5), label="cuts"))
    last_end = data.draw(st.sampled_from([None, size]), label="last end")
    bounds: list[tuple[int, int | None]] = list(zip([0, *cuts], [*cuts, last_end], strict=True))
    union = []
    with data_file(file_bytes) as path:
        for start, end in bounds:
            got = rows(read_csv(path, start, end, chunk=chunk))
            owned = [x for x in expected if start <= x.offset and (end is None or x.offset < end)]
            assert got == text_rows(owned), f"split [{start}, {end})"
            union.extend(got)
    assert union == text_rows(expected)  # every data row once, in file order; never the header


@PROPERTY_SETTINGS
@given(rows_=csv_rows(), gz=st.booleans(), chunk=st.integers(1, 16))
def test_resume_from_any_next_offset_yields_exactly_the_remaining_rows(
    rows_: list[Row], gz: bool, chunk: int
) -> None:
    file_bytes, expected = build(HEADER, rows_)
    kind = "csv.gz" if gz else "csv"
    with data_file(file_bytes, gz=gz) as path:
        assert rows(read_csv(path, 0, None, chunk=chunk, kind=kind)) == text_rows(expected)
        for i, x in enumerate(expected):
            resumed = read_csv(path, 0, None, resume=x.next_offset, chunk=chunk, kind=kind)
            assert rows(resumed) == text_rows(expected[i + 1 :]), f"resume from {x.next_offset}"


@PROPERTY_SETTINGS
@given(rows_=csv_rows(), data=st.data(), chunk=st.integers(1, 16))
def test_resume_inside_a_mid_file_split(rows_: list[Row], data: st.DataObject, chunk: int) -> None:
    file_bytes, expected = build(HEADER, rows_)
    size = len(file_bytes)
    start = data.draw(st.integers(0, size), label="start")
    end = data.draw(st.integers(start, size), label="end")
    owned = [x for x in expected if start <= x.offset < end]
    with data_file(file_bytes) as path:
        assert rows(read_csv(path, start, end, chunk=chunk)) == text_rows(owned)
        for x in owned:
            resumed = read_csv(path, start, end, resume=x.next_offset, chunk=chunk)
            assert rows(resumed) == text_rows([y for y in owned if y.offset > x.offset])


@PROPERTY_SETTINGS
@given(rows_=csv_rows(), limit=st.integers(1, 12), chunk=st.integers(1, 16))
def test_gzip_lines_match_the_plain_file_reader(rows_: list[Row], limit: int, chunk: int) -> None:
    """Same blocks (rows, dead letters, offsets, truncation) as plain JSON Lines."""
    file_bytes, _ = build(["h"], rows_)
    loose = RecordSchema((pa.field("a", pa.string()),))
    with (
        data_file(file_bytes, "a.jsonl") as plain,
        data_file(file_bytes, "a.jsonl.gz", gz=True) as gz,
    ):
        args = {"chunk": chunk, "limit": limit, "schema": loose}
        lines = read_csv(plain, 0, None, kind="jsonl", **args)  # type: ignore[arg-type]
        zipped = read_csv(gz, 0, None, kind="jsonl.gz", **args)  # type: ignore[arg-type]
    assert [(b.start, b.end, b.rows, b.dead) for b in lines] == [
        (b.start, b.end, b.rows, b.dead) for b in zipped
    ]


@st.composite
def events(draw: st.DrawFn) -> tuple[dict[str, str], dict[str, Any]]:
    text = st.text(alphabet='ab,"é漢 -', min_size=1, max_size=8)
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
    values = dict(zip(EVENT_FIELDS, (event_id, user_id, when, event_type, amount), strict=True))
    return fields, values


@PROPERTY_SETTINGS
@given(
    generated=st.lists(events(), max_size=6),
    columns=st.permutations(EVENT_FIELDS),
    gz=st.booleans(),
    chunk=st.integers(1, 64),
)
def test_events_round_trip_whatever_the_column_order(
    generated: list[tuple[dict[str, str], dict[str, Any]]],
    columns: list[str],
    gz: bool,
    chunk: int,
) -> None:
    file_bytes, expected = build(
        columns, [Row([fields[c] for c in columns], b"\r\n") for fields, _ in generated]
    )
    kind = "csv.gz" if gz else "csv"
    with data_file(file_bytes, gz=gz) as path:
        blocks = read_csv(path, 0, None, chunk=chunk, kind=kind, schema=EVENTS)
    assert [b.dead for b in blocks if b.dead] == []
    got = rows(blocks)
    assert got == [
        {**values, OFFSET: x.offset} for (_, values), x in zip(generated, expected, strict=True)
    ]
    if got:
        latest = max(b.max_event_time for b in blocks if b.max_event_time is not None)
        assert latest == max(v["event_time"] for _, v in generated)


def test_orders_with_columns_missing_from_the_header_are_null() -> None:
    header = ["total", "order_no", "ignored", "region", "placed_at", "paid", "placed_on"]
    data, expected = build(
        header,
        [
            Row(["12.5", "7", "x", "eu", "2026-01-01T00:00:00Z", "True", "2026-01-02"], b"\n"),
            Row(["1", "8", "", "us", "2026-01-01 01:00:00+01:00", "", ""], b"\n"),
        ],
    )
    with data_file(data) as path:
        got = rows(read_csv(path, 0, None, chunk=5, schema=ORDERS))
    nulls = {"weight": None, "note": None, "shipped": None, "tag": None, "qty": None}
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    assert got == [
        {
            "region": "eu",
            "order_no": 7,
            "placed_at": t0,
            "placed_on": date(2026, 1, 2),
            "total": Decimal("12.50"),
            "paid": True,
            **nulls,
            OFFSET: expected[0].offset,
        },
        {
            "region": "us",
            "order_no": 8,
            "placed_at": t0,
            "placed_on": None,
            "total": Decimal("1.00"),
            "paid": None,
            **nulls,
            OFFSET: expected[1].offset,
        },
    ]


# -- malformed rows --------------------------------------------------------------------------

GOOD = ["e1", "42", "2026-01-01T00:00:00+00:00", "click", "1.5"]


def parse_line(content: bytes, *, truncated: bool = False) -> tuple[Any, ...] | str | None:
    parser = CsvLinesParser(RecordConverter(EVENTS), list(EVENT_FIELDS), 100)
    return parser.parse_line(content, truncated)


def with_field(index: int, value: str) -> bytes:
    return encode_row([value if i == index else v for i, v in enumerate(GOOD)])


def test_good_row_parses() -> None:
    event = ("e1", 42, datetime(2026, 1, 1, tzinfo=UTC), "click", 1.5)
    assert parse_line(encode_row(GOOD)) == event
    assert parse_line(with_field(2, "2026-01-01T00:00:00")) == event
    assert parse_line(with_field(1, " 42 ")) == event


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
        (b'e1,42,2026-01-01T00:00:00Z,"cli', UNBALANCED),
        (b'ck",1.5', UNBALANCED),
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
    head = encode_row(list(EVENT_FIELDS))
    body = b'e1,42,2026-01-01T00:00:00Z,"two\nlines",1.5\n' + encode_row(GOOD) + b"\n"
    with data_file(head + b"\n" + body) as path:
        blocks = read_csv(path, 0, None, chunk=7, schema=EVENTS)
    assert [(offset, reason) for b in blocks for offset, _, reason in b.dead] == [
        (len(head) + 1, UNBALANCED),
        (len(head) + 1 + 32, UNBALANCED),
    ]
    assert [row["event_id"] for row in rows(blocks)] == ["e1"]


# -- headers ---------------------------------------------------------------------------------


def test_header_with_bom_and_crlf_and_a_split_starting_inside_it() -> None:
    data = b"\xef\xbb\xbfevent_id , user_id\r\nx,1\r\ny,2\r\n"
    schema = RecordSchema((pa.field("event_id", pa.string()), pa.field("user_id", pa.int64())))
    with data_file(data) as path:
        first = read_csv(path, 0, 5, chunk=4, schema=schema)
        second = read_csv(path, 5, None, chunk=4, schema=schema)
    assert rows(first) == []
    assert rows(second) == [
        {"event_id": "x", "user_id": 1, OFFSET: 23},
        {"event_id": "y", "user_id": 2, OFFSET: 28},
    ]


@pytest.mark.parametrize("data", [b"", b"a,b", b"a,b\n", b"a,b\r\n"])
def test_empty_and_header_only_files_have_no_records(data: bytes) -> None:
    with data_file(data) as path:
        blocks = read_csv(path, 0, None, chunk=1)
    assert rows(blocks) == [] and all(not b.dead for b in blocks)


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
    with data_file(data) as path, pytest.raises(CsvHeaderError, match=f"split 7 .*{message}"):
        read_csv(path, 2, None, chunk=4, limit=10)


def test_header_of_exactly_the_limit_with_crlf_is_accepted() -> None:
    schema = RecordSchema((pa.field("abc", pa.string()),))
    with data_file(b"abc\r\n1\n") as path:
        assert rows(read_csv(path, 0, None, chunk=64, limit=3, schema=schema)) == [
            {"abc": "1", OFFSET: 5}
        ]


# -- gzip ------------------------------------------------------------------------------------


def test_gzip_file_read_as_one_split_yields_all_rows() -> None:
    rows_ = [Row(["r", str(i), "漢" * (i % 4)], b"\n") for i in range(500)]
    file_bytes, expected = build(HEADER, rows_)
    with data_file(file_bytes, "part-0.csv.gz", gz=True) as path:
        assert rows(read_csv(path, 0, None, chunk=1000, kind="csv.gz")) == text_rows(expected)


@pytest.mark.parametrize("bounds", [(0, 100), (5, None)])
def test_gzip_split_must_cover_the_whole_file(bounds: tuple[int, int | None]) -> None:
    a = file_assignment(1, "unused.csv.gz", bounds[0], bounds[1], kind="csv.gz")
    with pytest.raises(ValueError, match="must cover the whole file"):
        FormatRouter(TEXTS, max_line_bytes=10, dsn="unused").add_split(a)
    with pytest.raises(ValueError, match="must cover the whole file"):
        LineSplitReader(TEXTS, max_line_bytes=10).open(SplitRead.of(a))


def test_corrupt_gzip_fails_the_split() -> None:
    good = gzip.compress(b"id,name,note\n" + b"1,2,3\n" * 1000)
    with data_file(good[: len(good) // 2], "part-0.csv.gz") as path, pytest.raises(EOFError):
        read_csv(path, 0, None, chunk=100, kind="csv.gz")


@pytest.mark.parametrize("chunk", [1, 3, 8, 13, 64, 1 << 20])
def test_gzip_over_long_lines_are_dead_letters_and_following_lines_intact(chunk: int) -> None:
    data = b"id\nx,1\n" + b"x" * 40 + b"\nb\r\n" + "漢".encode() * 5 + b"\r\n\nc\n" + b"z" * 30
    schema = RecordSchema((pa.field("id", pa.string()),))
    with data_file(data, "part-0.csv.gz", gz=True) as path:
        blocks = read_csv(path, 0, None, chunk=chunk, limit=8, kind="csv.gz", schema=schema)
    too_long = "line too long: over 8 bytes"
    assert [entry for b in blocks for entry in b.dead] == [
        (3, b"x,1", "bad value: expected 1 fields, got 2"),
        (7, b"x" * 8, too_long),
        (51, "漢".encode() * 2 + "漢".encode()[:2], too_long),
        (71, b"z" * 8, too_long),
    ]
    assert rows(blocks) == [{"id": "b", OFFSET: 48}, {"id": "c", OFFSET: 69}]
    assert blocks[-1].end == len(data)
