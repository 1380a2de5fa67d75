"""ParquetSplitReader: row-group splits, row-index offsets, column-wise casts and bad rows.

The oracle is the list of rows the file was written from, with row indices counted while the
row groups are written.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any
from unittest import mock

import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from source_schemas import EVENTS, ORDERS, dead_of, file_assignment, read_blocks, rows_of

from spark_jobs.source import (
    OFFSET,
    ParquetSplitError,
    ParquetSplitReader,
    ParsedBlock,
    RecordSchema,
    SplitRead,
)
from spark_jobs.source._parquet_rows import BatchConverter

T0 = datetime(2026, 1, 1, tzinfo=UTC)
FILE_SCHEMA = pa.schema(
    [
        ("event_id", pa.string()),
        ("user_id", pa.int64()),
        ("event_time", pa.timestamp("us", tz="UTC")),
        ("event_type", pa.string()),
        ("amount", pa.float64()),
        ("unused", pa.string()),
    ]
)


def row(i: int) -> dict[str, Any]:
    return {
        "event_id": f"e{i}-漢",
        "user_id": i * 7,
        "event_time": T0 + timedelta(seconds=i),
        "event_type": "click" if i % 2 else "view",
        "amount": i / 4,
        "unused": "u",
    }


@contextmanager
def parquet_file(group_sizes: list[int]) -> Iterator[str]:
    """A file with one row group per size (empty groups included); row i holds ``row(i)``."""
    with tempfile.TemporaryDirectory() as directory:
        path = os.path.join(directory, "part-0.parquet")
        first = 0
        with pq.ParquetWriter(path, FILE_SCHEMA) as writer:
            for size in group_sizes:
                rows = [row(i) for i in range(first, first + size)]
                writer.write_table(pa.Table.from_pylist(rows, schema=FILE_SCHEMA))
                first += size
        assert pq.ParquetFile(path).metadata.num_row_groups == len(group_sizes)
        yield path


@contextmanager
def table_file(table: pa.Table, row_group_size: int | None = None) -> Iterator[str]:
    with tempfile.TemporaryDirectory() as directory:
        path = os.path.join(directory, "part-0.parquet")
        pq.write_table(table, path, row_group_size=row_group_size)
        yield path


def read(
    path: str,
    start: int,
    end: int | None,
    resume: int | None = None,
    *,
    batch_rows: int,
    schema: RecordSchema = EVENTS,
    stop: int | None = None,
) -> list[ParsedBlock]:
    a = file_assignment(1, path, start, end, resume, kind="parquet")
    split_read = SplitRead(1, a.split, a.resume_offset, stop, replay=stop is not None)
    blocks = read_blocks(ParquetSplitReader(schema, batch_rows=batch_rows), split_read, 1000)
    assert all(b.rows.num_rows + len(b.dead) <= batch_rows for b in blocks)
    return blocks


def expected(first: int, stop: int) -> list[dict[str, Any]]:
    return [
        {**{k: v for k, v in row(i).items() if k != "unused"}, OFFSET: i}
        for i in range(first, stop)
    ]


def first_rows(group_sizes: list[int]) -> list[int]:
    """The first row index of every row group, plus the total row count."""
    firsts = [0]
    for size in group_sizes:
        firsts.append(firsts[-1] + size)
    return firsts


# -- row groups and offsets ------------------------------------------------------------------

group_sizes_strategy = st.lists(st.integers(0, 5), max_size=6)
PROPERTY_SETTINGS = settings(database=None, deadline=None, max_examples=100)


@PROPERTY_SETTINGS
@given(sizes=group_sizes_strategy, data=st.data(), batch_rows=st.integers(1, 7))
def test_row_group_splits_yield_every_row_exactly_once_in_order(
    sizes: list[int], data: st.DataObject, batch_rows: int
) -> None:
    groups = len(sizes)
    firsts = first_rows(sizes)
    valid = [k for k in range(groups + 1) if firsts[k] >= k]  # see test_ambiguous_split_start
    cuts = sorted(data.draw(st.lists(st.sampled_from(valid), max_size=4), label="cuts"))
    last_end = data.draw(st.sampled_from([None, groups]), label="last end")
    bounds: list[tuple[int, int | None]] = list(zip([0, *cuts], [*cuts, last_end], strict=True))
    union = []
    with parquet_file(sizes) as path:
        for start, end in bounds:
            blocks = read(path, start, end, batch_rows=batch_rows)
            stop = firsts[groups if end is None else end]
            assert rows_of(blocks) == expected(firsts[start], stop), f"groups [{start}, {end})"
            for block in blocks:
                assert block.end - block.start == block.rows.num_rows
            union.extend(rows_of(blocks))
    assert union == expected(0, firsts[-1])


@PROPERTY_SETTINGS
@given(sizes=group_sizes_strategy, data=st.data(), batch_rows=st.integers(1, 7))
def test_resume_and_replay_from_any_row_offset_yield_exactly_those_rows(
    sizes: list[int], data: st.DataObject, batch_rows: int
) -> None:
    groups = len(sizes)
    firsts = first_rows(sizes)
    valid = [k for k in range(groups + 1) if firsts[k] >= k]
    start = data.draw(st.sampled_from(valid), label="start")
    end = data.draw(st.sampled_from([None, *range(start, groups + 1)]), label="end")
    first, stop = firsts[start], firsts[groups if end is None else end]
    with parquet_file(sizes) as path:
        assert rows_of(read(path, start, end, batch_rows=batch_rows)) == expected(first, stop)
        # Every row offset of the split (a committed offset) and the end of the split.
        for offset in range(first, stop + 1):
            resumed = read(path, start, end, offset, batch_rows=batch_rows)
            assert rows_of(resumed) == expected(offset, stop), f"resume from row {offset}"
            for after in (offset + 1, stop):  # replayed ranges, [o, o + 1) among them
                replayed = read(path, start, end, offset, batch_rows=batch_rows, stop=after)
                assert rows_of(replayed) == expected(offset, min(after, stop))


def test_fresh_assignment_resume_offset_is_the_row_group_index() -> None:
    """The store hands out resume_offset = start (a row-group index) while nothing is committed."""
    with parquet_file([4, 4, 4]) as path:
        assert rows_of(read(path, 2, 3, resume=2, batch_rows=3)) == expected(8, 12)


def test_empty_row_groups_before_a_valid_start() -> None:
    with parquet_file([3, 0, 0, 5, 0]) as path:
        assert rows_of(read(path, 3, None, batch_rows=2)) == expected(3, 8)
        assert rows_of(read(path, 4, None, batch_rows=2)) == []
        assert rows_of(read(path, 3, None, resume=5, batch_rows=2)) == expected(5, 8)


def test_ambiguous_split_start_fails_the_split() -> None:
    """Row group 2 starts at row 0: a committed offset 2 could mean "fresh" or "after row 1"."""
    with parquet_file([0, 0, 5]) as path:
        with pytest.raises(ParquetSplitError, match="below its own index"):
            read(path, 2, None, batch_rows=2)
        assert rows_of(read(path, 0, None, batch_rows=2)) == expected(0, 5)
    with parquet_file([0, 0, 0]) as path:  # no rows: nothing is ambiguous
        assert read(path, 2, None, batch_rows=2) == []


def test_corrupt_and_missing_files_fail_the_split() -> None:
    with tempfile.TemporaryDirectory() as directory:
        path = os.path.join(directory, "part-0.parquet")
        Path(path).write_bytes(b"PAR1 this is not a parquet file")
        with pytest.raises(ParquetSplitError, match=r"split 1: cannot read Parquet file"):
            read(path, 0, None, batch_rows=4)
    with pytest.raises(ParquetSplitError, match="cannot read"):
        read("/nonexistent/part-0.parquet", 0, None, batch_rows=4)


@pytest.mark.parametrize(("start", "end"), [(0, 3), (3, None), (2, 1)])
def test_row_groups_outside_the_file_fail_the_split(start: int, end: int | None) -> None:
    with parquet_file([1, 1]) as path, pytest.raises(ParquetSplitError, match=r"outside 0\.\.2"):
        read(path, start, end, batch_rows=4)


# -- columns and casts -----------------------------------------------------------------------


def test_declared_columns_missing_from_the_file_are_null() -> None:
    optional = RecordSchema((pa.field("user_id", pa.int64()), pa.field("absent", pa.date32())))
    with parquet_file([3, 2]) as path:
        got = rows_of(read(path, 1, None, batch_rows=10, schema=optional))
    assert got == [{"user_id": i * 7, "absent": None, OFFSET: i} for i in (3, 4)]
    with parquet_file([2]) as path:
        blocks = read(path, 0, None, batch_rows=10)
        assert dead_of(read(path, 0, None, batch_rows=10, schema=ORDERS)) == [
            (i, b"{}", "missing field: region, order_no, placed_at, total") for i in (0, 1)
        ]
    assert blocks[0].max_event_time == T0 + timedelta(seconds=1)


def test_timestamp_text_and_decimal_columns_convert() -> None:
    table = pa.table(
        {
            "event_id": pa.array([b"e1", b"e2", b"e3"], pa.binary()),
            "user_id": pa.array([1, 2, 3], pa.int32()),
            "event_time": pa.array([0, 1, 1_500], pa.timestamp("ns")),  # naive, nanoseconds
            "event_type": pa.array(["a", "b", "c"], pa.large_string()),
            "amount": pa.array([Decimal("1.25"), Decimal("2"), None], pa.decimal128(5, 2)),
        }
    )
    epoch = datetime(1970, 1, 1, tzinfo=UTC)
    with table_file(table) as path:
        blocks = read(path, 0, None, batch_rows=10)
    assert rows_of(blocks) == [
        {"event_id": "e1", "user_id": 1, "event_time": epoch, "event_type": "a", "amount": 1.25,
         OFFSET: 0},
        {"event_id": "e2", "user_id": 2, "event_time": epoch, "event_type": "b", "amount": 2.0,
         OFFSET: 1},  # 1 ns truncated to microseconds
    ]  # fmt: skip
    assert dead_of(blocks) == [
        (
            2,
            b'{"event_id":"e3","user_id":3,"event_time":"1970-01-01T00:00:00.000001+00:00",'
            b'"event_type":"c","amount":null}',
            "missing field: amount",
        )
    ]


def orders_table(values: list[dict[str, Any]]) -> pa.Table:
    """ORDERS in other Parquet types, each needing a cast (or the row path)."""
    types = {
        "region": pa.large_string(),
        "order_no": pa.int64(),
        "placed_at": pa.timestamp("ns", tz="Europe/Paris"),
        "placed_on": pa.date64(),
        "total": pa.decimal128(12, 3),
        "paid": pa.bool_(),
        "weight": pa.float64(),
        "note": pa.dictionary(pa.int32(), pa.string()),
        "shipped": pa.timestamp("ms"),
        "tag": pa.string(),
        "qty": pa.int16(),
    }
    return pa.table(
        {name: pa.array([v[name] for v in values], kind) for name, kind in types.items()}
    )


@st.composite
def orders(draw: st.DrawFn) -> dict[str, Any]:
    when = T0 + timedelta(milliseconds=draw(st.integers(-(10**11), 10**11)))
    return {
        "region": draw(st.sampled_from(["eu", "us", "é漢"])),
        "order_no": draw(st.integers(-(2**31), 2**31 - 1)),
        "placed_at": when,
        "placed_on": draw(st.one_of(st.none(), st.dates(date(1, 1, 1), date(9999, 12, 31)))),
        "total": Decimal(draw(st.integers(-(10**10) + 1, 10**10 - 1))).scaleb(-2),
        "paid": draw(st.one_of(st.none(), st.booleans())),
        "weight": draw(st.one_of(st.none(), st.floats(-1e30, 1e30))),
        "note": draw(st.one_of(st.none(), st.sampled_from(["a", "b"]))),
        "shipped": when.replace(tzinfo=None),
        "tag": draw(st.one_of(st.none(), st.text(max_size=3))),
        "qty": draw(st.integers(-128, 127)),
    }


BAD_ROWS: list[tuple[dict[str, Any], str]] = [
    ({"order_no": 2**40}, f"bad value: order_no {2**40} is outside the int32 range"),
    ({"qty": 300}, "bad value: qty 300 is outside the int8 range"),
    ({"weight": 1e39}, "bad value: weight 1e+39 is outside the float32 range"),
    ({"weight": float("nan")}, "bad value: weight nan is not finite"),
    ({"total": Decimal("1.234")}, "bad value: total 1.234 does not fit decimal(10,2)"),
    (
        {"total": Decimal("123456789.5")},
        "bad value: total 123456789.500 does not fit decimal(10,2)",
    ),
    ({"region": None}, "missing field: region"),
]


@settings(database=None, deadline=None, max_examples=60)
@given(
    values=st.lists(orders(), min_size=1, max_size=12),
    bad=st.lists(st.tuples(st.integers(0, 12), st.sampled_from(range(len(BAD_ROWS))))),
    batch_rows=st.integers(1, 8),
)
def test_casts_equal_the_row_path_and_bad_rows_are_found(
    values: list[dict[str, Any]], bad: list[tuple[int, int]], batch_rows: int
) -> None:
    """A batch cast column-wise and a batch read row by row (it holds a bad row) give the
    same rows; exactly the bad rows are dead letters, with their reasons."""
    row_by_row = AssertionError("a clean batch went row by row")
    with (
        table_file(orders_table(values)) as path,
        mock.patch.object(BatchConverter, "by_row", side_effect=row_by_row),
    ):
        clean = rows_of(read(path, 0, None, batch_rows=batch_rows, schema=ORDERS))
    mixed, reasons = list(values), {}
    for at, kind in sorted(bad, reverse=True):
        change, reason = BAD_ROWS[kind]
        mixed.insert(min(at, len(mixed)), {**values[0], **change})
    for i, value in enumerate(mixed):
        for change, reason in BAD_ROWS:
            if all(value[k] is v or value[k] == v for k, v in change.items()):
                reasons[i] = reason
    with table_file(orders_table(mixed)) as path:
        blocks = read(path, 0, None, batch_rows=batch_rows, schema=ORDERS)
    assert [(offset, reason) for offset, _, reason in dead_of(blocks)] == sorted(reasons.items())
    good = rows_of(blocks)
    assert [r[OFFSET] for r in good] == [i for i in range(len(mixed)) if i not in reasons]
    strip = [{k: v for k, v in r.items() if k != OFFSET} for r in good]
    assert repr(strip) == repr([{k: v for k, v in r.items() if k != OFFSET} for r in clean])
    for offset, raw, _ in dead_of(blocks):
        assert orjson.loads(raw)["order_no"] == mixed[offset]["order_no"]


def test_invalid_utf8_and_values_beyond_python_are_dead_letters() -> None:
    table = pa.table(
        {
            "region": pa.array([b"eu", b"\xff", b"us"], pa.binary()),
            "order_no": pa.array([1, 2, 3], pa.int32()),
            "placed_at": pa.array([0, 0, 1 << 62], pa.timestamp("us", tz="UTC")),
            "total": pa.array([1, 2, 3], pa.int64()),  # int -> decimal: the row path
            "placed_on": pa.array([0, 3_000_000, 0], pa.date32()),
        }
    )
    with table_file(table) as path:
        blocks = read(path, 0, None, batch_rows=10, schema=ORDERS)
    [first] = rows_of(blocks)
    assert first["total"] == Decimal("1.00") and first["region"] == "eu"
    assert first["placed_on"] == date(1970, 1, 1)
    dead = dead_of(blocks)
    assert [offset for offset, _, _ in dead] == [1, 2]
    assert dead[0][2].startswith("bad value: placed_on cannot be read: ")
    assert dead[1][2].startswith("bad value: placed_at cannot be read: ")


def test_replay_of_single_rows_across_row_groups() -> None:
    with parquet_file([2, 3, 1]) as path:
        for offset in range(6):
            blocks = read(path, 0, None, offset, batch_rows=2, stop=offset + 1)
            assert rows_of(blocks) == expected(offset, offset + 1)
            assert all(block.start == offset and block.end == offset + 1 for block in blocks)


@pytest.mark.parametrize(
    ("name", "column"),
    [
        ("placed_at", pa.array([0, 1 << 62], pa.timestamp("us", tz="UTC"))),
        ("placed_at", pa.array([0, -(1 << 62)], pa.timestamp("us"))),
        ("placed_on", pa.array([0, 3_000_000], pa.date32())),
    ],
)
def test_times_beyond_python_go_row_by_row(name: str, column: pa.Array) -> None:
    """Arrow holds them, Python (the exact path) cannot: such a row is a dead letter."""
    columns = {
        "region": pa.array(["eu", "us"]),
        "order_no": pa.array([1, 2], pa.int32()),
        "placed_at": pa.array([0, 0], pa.timestamp("us", tz="UTC")),
        "total": pa.array([Decimal(1), Decimal(2)], pa.decimal128(10, 2)),
    }
    with table_file(pa.table({**columns, name: column})) as path:
        blocks = read(path, 0, None, batch_rows=10, schema=ORDERS)
    assert [r["order_no"] for r in rows_of(blocks)] == [1]
    [(offset, _, reason)] = dead_of(blocks)
    assert offset == 1 and reason.startswith(f"bad value: {name} cannot be read: ")
