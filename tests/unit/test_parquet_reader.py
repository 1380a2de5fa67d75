"""ParquetSplitReader (row-group splits, row-index offsets) and parse_parquet_record.

The oracle is the list of rows the file was written from, with row indices counted while the
row groups are written.
"""

from __future__ import annotations

import math
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from enumerator_service import FileSplit, SplitAssignment
from spark_jobs.source._events import Event
from spark_jobs.source._parquet_reader import (
    ParquetSplitError,
    ParquetSplitReader,
    RowRecord,
    parse_parquet_record,
)
from spark_jobs.source._records import RawLine

T0 = datetime(2026, 1, 1, tzinfo=UTC)
SCHEMA = pa.schema(
    [
        ("event_id", pa.string()),
        ("user_id", pa.int64()),
        ("event_time", pa.timestamp("us", tz="UTC")),
        ("event_type", pa.string()),
        ("amount", pa.float64()),
    ]
)


def row(i: int) -> dict[str, Any]:
    return {
        "event_id": f"e{i}-漢",
        "user_id": i * 7,
        "event_time": T0 + timedelta(seconds=i),
        "event_type": "click" if i % 2 else "view",
        "amount": i / 4,
    }


@contextmanager
def parquet_file(group_sizes: list[int], schema: pa.Schema = SCHEMA) -> Iterator[str]:
    """A file with one row group per size (empty groups included); row i holds ``row(i)``."""
    with tempfile.TemporaryDirectory() as directory:
        path = os.path.join(directory, "part-0.parquet")
        first = 0
        with pq.ParquetWriter(path, schema) as writer:
            for size in group_sizes:
                rows = [row(i) for i in range(first, first + size)]
                writer.write_table(pa.Table.from_pylist(rows, schema=schema))
                first += size
        assert pq.ParquetFile(path).metadata.num_row_groups == len(group_sizes)
        yield path


@contextmanager
def table_file(table: pa.Table) -> Iterator[str]:
    with tempfile.TemporaryDirectory() as directory:
        path = os.path.join(directory, "part-0.parquet")
        pq.write_table(table, path)
        yield path


def assignment(
    split_id: int, path: str, start: int, end: int | None, resume: int | None = None
) -> SplitAssignment:
    split = FileSplit("events", "parquet", path, start, end, None)
    return SplitAssignment(
        split_id, split, epoch=1, resume_offset=start if resume is None else resume
    )


def drain(
    assignments: list[SplitAssignment], *, batch_rows: int, columns: list[str] | None = None
) -> dict[int, list[RowRecord]]:
    """Rows per split id; checks every split finishes exactly once, in assignment order."""
    reader = ParquetSplitReader(batch_rows=batch_rows, columns=columns)
    for a in assignments:
        reader.add_split(a)
    rows: dict[int, list[RowRecord]] = {a.split_id: [] for a in assignments}
    finished: list[int] = []
    budget = 1000  # far more fetches than any test file needs
    try:
        while reader.has_splits():
            budget -= 1
            assert budget > 0, "reader makes no progress"
            batch = reader.fetch()
            for split_id, records in batch.records.items():
                assert split_id not in finished, f"rows for split {split_id} after it finished"
                assert len(records) <= batch_rows
                rows[split_id].extend(records)
            finished.extend(batch.finished)
    finally:
        reader.close()
    assert finished == [a.split_id for a in assignments]
    return rows


def expected(first: int, stop: int) -> list[RowRecord]:
    return [RowRecord(i, i + 1, row(i)) for i in range(first, stop)]


def first_rows(group_sizes: list[int]) -> list[int]:
    """The first row index of every row group, plus the total row count."""
    firsts = [0]
    for size in group_sizes:
        firsts.append(firsts[-1] + size)
    return firsts


# -- properties ------------------------------------------------------------------------------

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
    with parquet_file(sizes) as path:
        rows = drain(
            [assignment(i, path, s, e) for i, (s, e) in enumerate(bounds)], batch_rows=batch_rows
        )
    for i, (start, end) in enumerate(bounds):
        stop = firsts[groups if end is None else end]
        assert rows[i] == expected(firsts[start], stop), f"split {i} = row groups [{start}, {end})"
    assert [r for i in range(len(bounds)) for r in rows[i]] == expected(0, firsts[-1])


@PROPERTY_SETTINGS
@given(sizes=group_sizes_strategy, data=st.data(), batch_rows=st.integers(1, 7))
def test_resume_from_any_row_offset_yields_exactly_the_rest(
    sizes: list[int], data: st.DataObject, batch_rows: int
) -> None:
    groups = len(sizes)
    firsts = first_rows(sizes)
    valid = [k for k in range(groups + 1) if firsts[k] >= k]
    start = data.draw(st.sampled_from(valid), label="start")
    end = data.draw(st.sampled_from([None, *range(start, groups + 1)]), label="end")
    first, stop = firsts[start], firsts[groups if end is None else end]
    with parquet_file(sizes) as path:
        fresh = drain([assignment(1, path, start, end)], batch_rows=batch_rows)[1]
        assert fresh == expected(first, stop)
        # Every row offset of the split (a committed next_offset) and the end of the split.
        for offset in range(first, stop + 1):
            resumed = drain([assignment(1, path, start, end, offset)], batch_rows=batch_rows)[1]
            assert resumed == expected(offset, stop), f"resume from row {offset}"


def test_fresh_assignment_resume_offset_is_the_row_group_index() -> None:
    """The store hands out resume_offset = start (a row-group index) while nothing is committed."""
    with parquet_file([4, 4, 4]) as path:
        rows = drain([assignment(1, path, 2, 3, resume=2)], batch_rows=3)[1]
    assert rows == expected(8, 12)


def test_empty_row_groups_before_a_valid_start() -> None:
    with parquet_file([3, 0, 0, 5, 0]) as path:
        rows = drain([assignment(1, path, 3, None), assignment(2, path, 4, None)], batch_rows=2)
        resumed = drain([assignment(1, path, 3, None, resume=5)], batch_rows=2)[1]
    assert rows == {1: expected(3, 8), 2: []}
    assert resumed == expected(5, 8)


def test_ambiguous_split_start_fails_the_split() -> None:
    """Row group 2 starts at row 0: a committed offset 2 could mean "fresh" or "after row 1"."""
    with parquet_file([0, 0, 5]) as path:
        with pytest.raises(ParquetSplitError, match="below its own index"):
            drain([assignment(1, path, 2, None)], batch_rows=2)
        assert drain([assignment(1, path, 0, None)], batch_rows=2)[1] == expected(0, 5)
    with parquet_file([0, 0, 0]) as path:  # no rows: nothing is ambiguous
        assert drain([assignment(1, path, 2, None)], batch_rows=2)[1] == []


def test_column_projection_and_dead_letter_bytes() -> None:
    with parquet_file([3, 2]) as path:
        rows = drain([assignment(1, path, 1, None)], batch_rows=10, columns=["user_id", "amount"])[
            1
        ]
    assert rows == [RowRecord(i, i + 1, {"user_id": i * 7, "amount": i / 4}) for i in (3, 4)]
    record = RowRecord(9, 10, {"event_id": "e", "event_time": T0, "amount": Decimal("1.5")})
    assert record.as_raw_line() == RawLine(9, 10, record.as_raw_line().data)
    assert orjson.loads(record.as_raw_line().data) == {
        "event_id": "e",
        "event_time": "2026-01-01T00:00:00+00:00",
        "amount": "1.5",
    }


# -- unreadable files ------------------------------------------------------------------------


def test_corrupt_file_fails_the_split() -> None:
    with tempfile.TemporaryDirectory() as directory:
        path = os.path.join(directory, "part-0.parquet")
        Path(path).write_bytes(b"PAR1 this is not a parquet file")
        with pytest.raises(ParquetSplitError, match=r"split 1: cannot read Parquet file"):
            drain([assignment(1, path, 0, None)], batch_rows=4)


def test_missing_file_fails_the_split() -> None:
    with pytest.raises(ParquetSplitError, match="cannot read"):
        drain([assignment(1, "/nonexistent/part-0.parquet", 0, None)], batch_rows=4)


@pytest.mark.parametrize(("start", "end"), [(0, 3), (3, None), (2, 1)])
def test_row_groups_outside_the_file_fail_the_split(start: int, end: int | None) -> None:
    with parquet_file([1, 1]) as path, pytest.raises(ParquetSplitError, match=r"outside 0\.\.2"):
        drain([assignment(1, path, start, end)], batch_rows=4)


def test_wake_up_and_fetch_without_splits() -> None:
    reader = ParquetSplitReader()
    reader.wake_up()
    batch = reader.fetch()
    assert not batch.records and not batch.finished and not reader.has_splits()
    reader.close()


# -- parsing ---------------------------------------------------------------------------------


def parse(values: dict[str, Any]) -> Event | str:
    return parse_parquet_record(4, RowRecord(0, 1, values))


def test_rows_read_from_a_file_parse_to_events() -> None:
    with parquet_file([2, 1]) as path:
        rows = drain([assignment(1, path, 0, None)], batch_rows=2)[1]
    assert [parse_parquet_record(4, r) for r in rows] == [
        Event(4, f"e{i}-漢", i * 7, T0 + timedelta(seconds=i), row(i)["event_type"], i / 4)
        for i in range(3)
    ]


def test_timestamp_and_text_and_decimal_columns_convert() -> None:
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
        rows = drain([assignment(1, path, 0, None)], batch_rows=10)[1]
    assert [parse_parquet_record(4, r) for r in rows] == [
        Event(4, "e1", 1, epoch, "a", 1.25),
        Event(4, "e2", 2, epoch, "b", 2.0),  # 1 ns truncated to microseconds
        "missing field: amount",
    ]
    assert rows[2].values["event_time"] == datetime(1970, 1, 1, microsecond=1)


def test_iso_text_event_time_is_accepted() -> None:
    good = {**row(1), "event_time": "2026-01-01T00:00:01Z"}
    assert parse(good) == Event(4, "e1-漢", 7, T0 + timedelta(seconds=1), "click", 0.25)


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"user_id": None}, "missing field: user_id"),
        ({"user_id": "7"}, "wrong type: user_id must be an integer"),
        ({"user_id": 7.0}, "wrong type: user_id must be an integer"),
        ({"user_id": 2**63}, f"bad value: user_id {2**63} is outside the int64 range"),
        ({"amount": math.nan}, "bad value: amount nan is not finite"),
        ({"amount": Decimal("Infinity")}, "bad value: amount inf is not finite"),
        ({"amount": "1.5"}, "wrong type: amount must be a number"),
        ({"event_id": ""}, "wrong type: event_id must be a non-empty string"),
        ({"event_id": b"\xff"}, "invalid UTF-8: event_id is not valid UTF-8 text"),
        ({"event_time": "soon"}, "bad value: event_time 'soon' is not ISO-8601"),
        (
            {"event_time": date(2026, 1, 1)},
            "wrong type: event_time must be a timestamp or ISO-8601 text, got <class "
            "'datetime.date'>",
        ),
    ],
)
def test_bad_rows_give_their_reason(change: dict[str, Any], reason: str) -> None:
    assert parse({**row(1), **change}) == reason


def test_a_missing_column_dead_letters_every_row() -> None:
    table = pa.table({"event_id": ["e1"], "user_id": [1], "event_type": ["a"], "amount": [1.0]})
    with table_file(table) as path:
        rows = drain([assignment(1, path, 0, None)], batch_rows=10)[1]
    assert [parse_parquet_record(4, r) for r in rows] == ["missing field: event_time"]
