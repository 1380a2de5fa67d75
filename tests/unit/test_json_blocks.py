"""Blocks of JSON Lines parsed at once give exactly what the exact per-line path gives.

``JsonLinesParser.parse`` (Arrow's JSON reader behind column checks, halving on failure) must
agree with ``parse_exact`` (orjson and ``RecordConverter`` line by line) on every input and
for every schema: the same rows (values, types, offsets, order), the same dead letters
(offset, raw bytes, reason), whatever the mix of good and malformed lines. A clean block must
take the fast path (no per-line work). And ``LineSplitReader`` must cover exactly the lines
of its range for any split boundaries and chunk sizes, a block's range re-read giving it back.
"""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal
from itertools import pairwise
from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from source_schemas import EVENTS, ORDERS, file_assignment, read_blocks

from spark_jobs.source import (
    OFFSET,
    JsonLinesParser,
    LineSplitReader,
    ParsedBlock,
    RecordSchema,
    SplitRead,
)

GOOD = {
    "event_id": "e1",
    "user_id": 7,
    "event_time": "2026-01-01T00:00:01.5+00:00",
    "event_type": "click",
    "amount": 2.5,
}
#: Lines the fast path must hand to the per-line path (or agree on), one per tricky case.
EVENT_ODD = [
    b"",
    b"   ",
    b"\r",
    b"{not json",
    b"[1, 2]",
    b"5",
    b"{}",
    orjson.dumps({**GOOD, "user_id": None}),
    orjson.dumps({k: v for k, v in GOOD.items() if k != "user_id"}),
    orjson.dumps({**GOOD, "user_id": 1.0}),
    orjson.dumps({**GOOD, "user_id": True}),
    orjson.dumps({**GOOD, "user_id": "7"}),
    orjson.dumps(GOOD).replace(b'"user_id":7', b'"user_id":' + str(1 << 70).encode()),
    orjson.dumps(GOOD).replace(b'"user_id":7', b'"user_id":' + str(1 << 63).encode()),
    orjson.dumps(GOOD).replace(b'"user_id":7', b'"user_id":1e2'),
    orjson.dumps({**GOOD, "amount": "twelve"}),
    orjson.dumps({**GOOD, "amount": 3}),
    orjson.dumps({**GOOD, "amount": False}),
    orjson.dumps(GOOD).replace(b'"amount":2.5', b'"amount":-0'),
    orjson.dumps(GOOD).replace(b'"amount":2.5', b'"amount":-0.0'),
    orjson.dumps(GOOD).replace(b'"amount":2.5', b'"amount":' + str(1 << 70).encode()),
    orjson.dumps({**GOOD, "event_id": ""}),
    orjson.dumps({**GOOD, "event_id": 5}),
    orjson.dumps({**GOOD, "event_type": ""}),
    orjson.dumps({**GOOD, "event_time": "yesterday"}),
    orjson.dumps({**GOOD, "event_time": "2026-02-30T00:00:00+00:00"}),
    orjson.dumps({**GOOD, "event_time": "2026-01-01T00:00:00"}),
    orjson.dumps({**GOOD, "event_time": "2026-01-01 10:00:00Z"}),
    orjson.dumps({**GOOD, "event_time": "2026-01-01T00:00:00+0530"}),
    orjson.dumps({**GOOD, "event_time": "2026-01-01T23:59:59-23:59"}),
    orjson.dumps({**GOOD, "event_time": "0001-01-01T00:00:00+01:00"}),
    orjson.dumps({**GOOD, "extra": {"nested": [1, {"a": None}]}}),
    orjson.dumps(GOOD)[:-1] + b',"extra":NaN}',
    orjson.dumps(GOOD)[:-1] + b',"extra":' + b"9" * 400 + b"}",
    orjson.dumps(GOOD)[:-1] + b',"extra":' + b"[" * 1100 + b"]" * 1100 + b"}",
    orjson.dumps(GOOD).replace(b'"amount":2.5', b'"amount":NaN'),
    orjson.dumps(GOOD).replace(b'"amount":2.5', b'"amount":1e400'),
    orjson.dumps(GOOD).replace(b'"user_id":7', b'"user_id":7,"user_id":8'),
    orjson.dumps(GOOD).replace(b'"event_id"', b'"\\u0065vent_id"'),
    orjson.dumps(GOOD).replace(b'"e1"', b'"\\ud800"'),
    orjson.dumps(GOOD).replace(b'"e1"', b'"e\\u00e9\\n\\/"'),
    orjson.dumps(GOOD) + orjson.dumps(GOOD),
    orjson.dumps(GOOD) + b" x",
    orjson.dumps(GOOD).replace(b"click", b"cl\xffck"),
    orjson.dumps(GOOD).replace(b"click", "clïck".encode()),
    orjson.dumps(GOOD).replace(b"click", b"cl\tck"),
    orjson.dumps(GOOD)[:-1] + b',"x":"\xff"}',
    b"\xef\xbb\xbf" + orjson.dumps(GOOD),
    orjson.dumps(GOOD) + b"\r",
    b" " + orjson.dumps(GOOD),
    orjson.dumps({**GOOD, "event_type": "x" * 300}),
]

ORDER = {
    "region": "eu",
    "order_no": 7,
    "placed_at": "2026-01-01T00:00:01.5+00:00",
    "placed_on": "2026-01-01",
    "total": "12.50",
    "paid": True,
    "weight": 1.5,
    "note": "n",
    "shipped": "2026-01-02T03:04:05",
    "tag": "abc",
    "qty": 3,
}


def order(**change: Any) -> bytes:
    return orjson.dumps({**ORDER, **change})


ORDER_ODD = [
    b"",
    b"{}",
    order(total=12.5),
    order(total=99999999.99),
    order(total=123456789.5),
    order(total="123456789.5"),
    order(total=9999999999999.99),
    order(total="0.005"),
    order(total="1e2"),
    order(total=" 1.5"),
    order(total="1_0"),
    order(total=True),
    order(total=None),
    order(total=1.0).replace(b"1.0", b"1e-400"),
    order(order_no=2**31),
    order(order_no=-(2**31)),
    order(qty=200),
    order(qty=-128),
    order(weight=1e39),
    order(weight=3.4028235e38),
    order(weight=1.0).replace(b"1.0", b"-0"),
    order(paid=1),
    order(paid=None),
    order(placed_on="2026-02-29"),
    order(placed_on="2024-02-29"),
    order(placed_on="2026-2-1"),
    order(placed_on="0000-01-01"),
    order(placed_on=20260101),
    order(shipped="2026-01-02T03:04:05+02:00"),
    order(shipped="2026-01-02"),
    order(shipped="2026-01-02T03:04:05.1234567"),
    order(tag="é\u0000"),
    order(tag=5),
    order(region=None),
    orjson.dumps({k: v for k, v in ORDER.items() if k not in ("region", "total")}),
    order(note=5),
    order(note=None),
    order(extra=[1, 2]),
    order()[:-1] + b',"extra":Infinity}',
    order().replace(b'"region"', b'"\\u0072egion"'),
    order()[:-2],
]

SCHEMAS = {"events": (EVENTS, EVENT_ODD), "orders": (ORDERS, ORDER_ODD)}


def good_line(schema: RecordSchema, i: int) -> bytes:
    if schema is EVENTS:
        when = f"2026-01-01T00:{i % 60:02d}:00+01:00"
        return orjson.dumps({**GOOD, "event_id": f"e{i}", "user_id": i, "event_time": when})
    return order(order_no=i, total=f"{i}.{i % 100:02d}", weight=i / 4, note=None if i % 3 else "x")


#: Parsers shared by the examples of a test run: a parser keeps a hint across blocks (the
#: last block had undeclared fields), which must never change a result.
PARSERS: dict[tuple[int, int], JsonLinesParser] = {}


def same(schema: RecordSchema, data: bytes, limit: int) -> None:
    """parse == parse_exact: rows (repr: -0.0 differs from 0.0), offsets, dead letters."""
    parser = PARSERS.setdefault((id(schema), limit), JsonLinesParser(schema, limit))
    rows, dead = parser.parse(data, 1000)
    exact_rows, exact_dead = parser.parse_exact(data, 1000)
    assert rows.schema == exact_rows.schema == schema.batch_schema
    assert repr(rows.to_pylist()) == repr(exact_rows.to_pylist())
    assert dead == exact_dead
    offsets = rows.column(OFFSET).to_pylist() + [offset for offset, _, _ in dead]
    assert len(set(offsets)) == len(offsets)
    assert rows.column(OFFSET).to_pylist() == sorted(rows.column(OFFSET).to_pylist())


@pytest.mark.parametrize(
    ("name", "odd"),
    [(name, line) for name, (_, odd) in SCHEMAS.items() for line in odd],
)
def test_each_odd_line_among_good_ones_is_handled_as_line_by_line(name: str, odd: bytes) -> None:
    schema = SCHEMAS[name][0]
    lines = [good_line(schema, i) for i in range(40)]
    lines[23] = odd
    same(schema, b"\n".join(lines) + b"\n", 1 << 20)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    name=st.sampled_from(sorted(SCHEMAS)),
    data=st.data(),
    limit=st.sampled_from([64, 140, 1 << 20]),
    newline_at_end=st.booleans(),
)
def test_any_mix_of_lines_parses_as_line_by_line(
    name: str, data: st.DataObject, limit: int, newline_at_end: bool
) -> None:
    schema, odd = SCHEMAS[name]
    kinds = data.draw(st.lists(st.integers(-1, len(odd) - 1), min_size=1, max_size=60))
    lines = [good_line(schema, i) if kind < 0 else odd[kind] for i, kind in enumerate(kinds)]
    same(schema, b"\n".join(lines) + (b"\n" if newline_at_end else b""), limit)


@pytest.mark.parametrize("schema", [EVENTS, ORDERS])
def test_a_clean_block_takes_the_fast_path(schema: RecordSchema) -> None:
    parser = JsonLinesParser(schema, 1 << 20)

    def per_line(content: bytes, truncated: bool = False) -> None:
        raise AssertionError(f"line parsed on its own: {content!r}")

    data = b"\n".join(good_line(schema, i) for i in range(500)) + b"\n"
    expected = parser.parse_exact(data, 0)
    parser.parse_line = per_line  # type: ignore[method-assign]
    rows, dead = parser.parse(data, 0)
    assert rows.equals(expected[0]) and dead == expected[1] == []


def test_a_few_malformed_lines_are_masked_not_split_around(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A truncated line and a type mismatch cost one more read of the whole block each (the
    bad lines masked in place and decided line by line), not reads of the runs between them."""
    import spark_jobs.source._blocks as blocks

    reads: list[int] = []
    read_json = blocks.pj.read_json

    def counted(buffer: pa.Buffer, **options: Any) -> pa.Table:
        reads.append(buffer.size)
        return read_json(buffer, **options)

    monkeypatch.setattr(blocks.pj, "read_json", counted)
    lines = [good_line(EVENTS, i) for i in range(200)]
    lines[50] = orjson.dumps(GOOD)[:-7]
    lines[120] = orjson.dumps({**GOOD, "amount": "twelve"})
    data = b"\n".join(lines) + b"\n"
    same(EVENTS, data, 1 << 20)
    assert reads == [len(data), len(data)]  # the failed read, then the read that succeeds


def test_a_bad_time_alone_keeps_the_zoned_times_cast_as_they_are() -> None:
    """The rows kept are all zoned when the only other time is no time at all: no offset is
    appended to every row (the note of a column with times without offset)."""
    from spark_jobs.source._json_columns import ColumnChecks

    checks = ColumnChecks(RecordSchema((pa.field("t", pa.timestamp("us", tz="UTC")),)))
    zoned = ["2026-01-01T00:00:00+01:00", None, "2026-01-01T00:00:01Z"]
    mask, notes = checks.suspects([pa.array([*zoned, "yesterday"])])
    assert mask is not None and mask.to_pylist() == [False, False, False, True]
    assert notes == [False]
    mask, notes = checks.suspects([pa.array([*zoned, "yesterday", "2026-01-01T00:00:00"])])
    assert mask is not None and mask.to_pylist() == [False, False, False, True, False]
    assert notes == [True]
    assert checks.suspects([pa.array(zoned)]) == (None, [False])


def test_suspects_that_are_dead_letters_leave_the_rows_in_order_unsorted(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A block is sorted by offset only when a suspect decided line by line is a row."""
    import spark_jobs.source._blocks as blocks

    sorts: list[int] = []
    sort_indices = blocks.pc.sort_indices

    def counted(values: pa.Array, *args: Any, **options: Any) -> pa.Array:
        sorts.append(len(values))
        return sort_indices(values, *args, **options)

    monkeypatch.setattr(blocks.pc, "sort_indices", counted)
    lines = [good_line(EVENTS, i) for i in range(100)]
    lines[30] = orjson.dumps({**GOOD, "event_time": "yesterday"})
    same(EVENTS, b"\n".join(lines) + b"\n", 1 << 20)
    assert sorts == []
    lines[60] = orjson.dumps(GOOD).replace(b'"amount":2.5', b'"amount":-0')  # a row
    same(EVENTS, b"\n".join(lines) + b"\n", 1 << 20)
    assert sorts == [99]


def test_good_lines_give_their_values_and_offsets() -> None:
    lines = [good_line(ORDERS, 1), b"", order(shipped="2026-01-02T03:04:05+02:00", tag="é")]
    data = b"\n".join(lines)
    rows, dead = JsonLinesParser(ORDERS, 1 << 20).parse(data, 50)
    assert dead == []
    first, second = rows.to_pylist()
    assert first[OFFSET] == 50 and second[OFFSET] == 50 + len(lines[0]) + 2
    assert first["total"] == Decimal("1.01") and first["note"] is None
    assert first["placed_at"] == datetime(2026, 1, 1, 0, 0, 1, 500000, tzinfo=UTC)
    assert second["shipped"] == datetime(2026, 1, 2, 1, 4, 5)
    assert second["tag"] == "é".encode() and second["qty"] == 3
    assert rows.schema == ORDERS.batch_schema


def test_malformed_lines_give_their_reasons() -> None:
    data = b"\n".join(
        [
            order(qty=200),
            order(total=123456789.5),
            order(weight=1e39),
            order(placed_on="2026-02-29"),
            order(region=None, total=None),
            order()[:-2],
        ]
    )
    _, dead = JsonLinesParser(ORDERS, 1 << 20).parse(data, 0)
    assert [reason for _, _, reason in dead] == [
        "bad value: qty 200 is outside the int8 range",
        "bad value: total 123456789.5 does not fit decimal(10,2)",
        "bad value: weight 1e+39 is outside the float32 range",
        "bad value: placed_on '2026-02-29' is not a YYYY-MM-DD date",
        "missing field: region, total",
        "invalid JSON: unexpected end of data: line 1 column 198 (char 197)",
    ]


# -- the block reader covers the lines of its range ------------------------------------------


def lines_in(data: bytes, start: int, end: int | None) -> tuple[int, int] | None:
    """(first byte, first byte after) of the lines whose first byte is in [start, end)."""
    offsets, at = [], 0
    for text in data.split(b"\n"):
        if at < len(data):
            offsets.append(at)
        at += len(text) + 1
    owned = [o for o in offsets if start <= o and (end is None or o < end)]
    if not owned:
        return None
    after = [o for o in offsets if o > owned[-1]]
    return owned[0], after[0] if after else len(data)


def reread(path: Path, start: int, end: int | None, block: ParsedBlock, limit: int) -> None:
    bounded = file_assignment(1, str(path), block.start, block.end).split
    read = SplitRead(1, bounded, block.start, block.end, replay=True)
    again = read_blocks(LineSplitReader(EVENTS, max_line_bytes=limit, chunk_bytes=1 << 20), read)
    assert repr([b.rows.to_pylist() for b in again]) == repr([block.rows.to_pylist()])
    assert [entry for b in again for entry in b.dead] == block.dead


@settings(
    max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    kinds=st.lists(st.integers(-3, len(EVENT_ODD) - 1), min_size=1, max_size=40),
    cuts=st.lists(st.floats(0, 1), max_size=3),
    chunk=st.sampled_from([7, 64, 300, 4096]),
    limit=st.sampled_from([100, 1 << 20]),
    tail=st.booleans(),
)
# Found by CI's run: a file opening with a BOM whose first line is too long (its dead letter's
# raw kept the BOM, which the rest of the reader reads as blanks).
@example(kinds=[47], cuts=[], chunk=7, limit=100, tail=False)
def test_blocks_cover_exactly_the_lines_of_their_range(
    tmp_path: Path, kinds: list[int], cuts: list[float], chunk: int, limit: int, tail: bool
) -> None:
    lines = [good_line(EVENTS, i) if k < 0 else EVENT_ODD[k] for i, k in enumerate(kinds)]
    data = b"\n".join(lines) + (b"\n" if tail else b"")
    path = tmp_path / "f.jsonl"
    path.write_bytes(data)
    parser = JsonLinesParser(EVENTS, limit)
    # A UTF-8 byte order mark opening the file is not content: the reader reads it as blanks
    # (offsets stay those of the file); anywhere else it is part of its line.
    as_read = b"   " + data[3:] if data.startswith(b"\xef\xbb\xbf") else data
    bounds = sorted({0, *(int(c * len(data)) for c in cuts)})
    for start, end in zip(bounds, [*bounds[1:], None], strict=True):
        reader = LineSplitReader(EVENTS, max_line_bytes=limit, chunk_bytes=chunk)
        blocks = read_blocks(reader, SplitRead.of(file_assignment(1, str(path), start, end)))
        owned = lines_in(data, start, end)
        if owned is None:
            assert all(not b.rows.num_rows and not b.dead for b in blocks)
            continue
        assert (blocks[0].start, blocks[-1].end) == owned
        for before, after in pairwise(blocks):
            assert before.end == after.start
        rows = pa.concat_batches([b.rows for b in blocks])
        exact_rows, exact_dead = parser.parse_exact(as_read[owned[0] : owned[1]], owned[0])
        assert repr(rows.to_pylist()) == repr(exact_rows.to_pylist())
        assert [entry for b in blocks for entry in b.dead] == exact_dead
        for block in blocks:  # a block's range re-read gives it again
            reread(path, start, end, block, limit)


# -- random values of every JSON type in every field -----------------------------------------

NUMBER_TEXTS = ["-0", "0", "1E2", "1e-400", "-1e-400", "1.5e1", "123456789012345678901", "0.1"]
TEXTS = [
    "2026-01-01",
    "2024-02-29",
    "2026-02-29",
    "2026-01-01T00:00:00",
    "2026-01-01T00:00:00.123456+05:30",
    "2026-01-01 00:00:00Z",
    "1.25",
    "-0.50",
    "1e3",
    "9" * 12,
    "",
    "é",
]
json_values = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**63), 2**64 - 1),
    st.integers(-300, 300),
    st.floats(allow_nan=False, allow_infinity=False),
    st.decimals(allow_nan=False, allow_infinity=False, places=3).map(float),
    st.sampled_from(TEXTS),
    st.text(max_size=4),
    st.lists(st.integers(-5, 5), max_size=2),
)


@st.composite
def random_line(draw: st.DrawFn, schema: RecordSchema) -> bytes:
    names = [field.name for field in schema.fields] + ["extra"]
    present = draw(st.lists(st.sampled_from(names), unique=True))
    values = {name: draw(json_values) for name in present}
    line = orjson.dumps(values)
    for name in present:  # a raw number literal instead of the value, now and then
        if draw(st.integers(0, 9)) == 0:
            literal = draw(st.sampled_from(NUMBER_TEXTS)).encode()
            line = line.replace(b'"' + name.encode() + b'":' + orjson.dumps(values[name]),
                                b'"' + name.encode() + b'":' + literal, 1)  # fmt: skip
    return line


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(name=st.sampled_from(sorted(SCHEMAS)), data=st.data())
def test_random_values_in_every_field_parse_as_line_by_line(name: str, data: st.DataObject) -> None:
    schema = SCHEMAS[name][0]
    count = data.draw(st.integers(1, 30))
    lines = [
        data.draw(random_line(schema)) if data.draw(st.booleans()) else good_line(schema, i)
        for i in range(count)
    ]
    same(schema, b"\n".join(lines) + b"\n", 1 << 20)
