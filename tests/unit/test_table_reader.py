"""TableRangeSplitReader against a fake connection: the query, key ranges and paging, the
exact per-row conversion of Postgres values, resume and replay reads."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta, timezone
from decimal import Decimal
from typing import Any

import orjson
import psycopg
import pytest
from source_schemas import ORDERS, dead_of, offsets_of, read_blocks, rows_of

from enumerator_service import SplitAssignment, TableRangeSplit
from spark_jobs.source import OFFSET, SplitRead, TableRangeSplitReader

T0 = datetime(2026, 1, 1, tzinfo=UTC)
SPLIT = TableRangeSplit("orders", "sales.orders", "id", 10, 40)


def good(key: int) -> tuple[Any, ...]:
    """(key, the declared columns as psycopg returns them)."""
    return (
        key,
        "eu",
        key,
        T0 + timedelta(seconds=key),
        date(2026, 1, 1),
        Decimal(key) / 4,
        key % 2 == 0,
        0.5,
        None,
        datetime(2026, 1, 2),
        b"\x00",
        1,
    )


class FakeConnection:
    def __init__(self, rows: list[tuple[Any, ...]]) -> None:
        self.rows = sorted(rows)
        self.queries: list[tuple[str, tuple[int, int, int]]] = []
        self.closed = False

    def execute(self, query: str, params: tuple[int, int, int], prepare: bool) -> Any:
        self.queries.append((query, params))
        low, high, limit = params
        found = [row for row in self.rows if low <= row[0] < high][:limit]

        class Cursor:
            def fetchall(self) -> list[tuple[Any, ...]]:
                return found

        return Cursor()

    def close(self) -> None:
        self.closed = True


@pytest.fixture
def connection(monkeypatch: pytest.MonkeyPatch) -> FakeConnection:
    rows = [good(key) for key in (5, 10, 11, 12, 20, 21, 30, 39, 40, 41)]
    rows[4] = (20, None, 20, "2026-01-01T00:00:20Z", None, Decimal("1.234"), *good(20)[6:])
    rows[6] = (30, "eu", 2**40, T0, None, Decimal(1), *good(30)[6:])
    conn = FakeConnection(rows)

    def connect(dsn: str, autocommit: bool) -> FakeConnection:
        assert dsn == "postgresql://db" and autocommit
        return conn

    monkeypatch.setattr(psycopg, "connect", connect)
    return conn


def read(resume: int, stop: int | None = None, batch_rows: int = 2) -> list[Any]:
    reader = TableRangeSplitReader(ORDERS, "postgresql://db", batch_rows=batch_rows)
    blocks = read_blocks(reader, SplitRead(3, SPLIT, resume, stop, replay=stop is not None))
    reader.close()
    return blocks


def test_the_query_selects_the_key_and_the_declared_columns_quoted(
    connection: FakeConnection,
) -> None:
    read(10)
    query, params = connection.queries[0]
    assert query == (
        'SELECT "id", "region", "order_no", "placed_at", "placed_on", "total", "paid", '
        '"weight", "note", "shipped", "tag", "qty" FROM "sales"."orders" '
        'WHERE "id" >= %s AND "id" < %s ORDER BY "id" LIMIT %s'
    )
    assert params == (10, 40, 2)
    assert connection.closed


def test_keys_of_the_range_in_pages_of_contiguous_blocks(connection: FakeConnection) -> None:
    blocks = read(10)
    assert [(b.start, b.end) for b in blocks] == [(10, 12), (12, 21), (21, 31), (31, 40)]
    assert [params for _, params in connection.queries] == [
        (10, 40, 2),
        (12, 40, 2),
        (21, 40, 2),
        (31, 40, 2),
    ]
    assert offsets_of(blocks) == [10, 11, 12, 21, 39]
    first = rows_of(blocks)[0]
    assert first == {
        "region": "eu",
        "order_no": 10,
        "placed_at": T0 + timedelta(seconds=10),
        "placed_on": date(2026, 1, 1),
        "total": Decimal("2.50"),
        "paid": True,
        "weight": 0.5,
        "note": None,
        "shipped": datetime(2026, 1, 2),
        "tag": b"\x00",
        "qty": 1,
        OFFSET: 10,
    }
    assert blocks[0].max_event_time == T0 + timedelta(seconds=11)


def test_bad_rows_are_dead_letters_with_the_row_as_json(connection: FakeConnection) -> None:
    dead = dead_of(read(10))
    assert [(key, reason) for key, _, reason in dead] == [
        (20, "missing field: region"),
        (30, f"bad value: order_no {2**40} is outside the int32 range"),
    ]
    raw = orjson.loads(dead[0][1])
    assert raw["total"] == "1.234" and raw["tag"] == "\x00" and raw["placed_at"].endswith("Z")


def test_resume_and_replay_read_exactly_their_keys(connection: FakeConnection) -> None:
    assert offsets_of(read(13)) == [21, 39]
    assert offsets_of(read(12, stop=22, batch_rows=100)) == [12, 21]
    for key in (10, 11, 12, 21, 39):
        assert offsets_of(read(key, stop=key + 1)) == [key]
    assert read(13, stop=20) == []
    assert offsets_of(read(39, stop=50)) == [39]  # never past the split's high key


def test_a_split_of_another_kind_is_refused() -> None:
    reader = TableRangeSplitReader(ORDERS, "postgresql://db")
    other = SplitAssignment(1, TableRangeSplit("s", "t.t", "k", 0, 1), 1, 0).split
    reader.open(SplitRead(1, other, 0))
    with pytest.raises(TypeError, match="not a table range split"):
        reader.open(SplitRead(1, object(), 0))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="batch_rows must be positive"):
        TableRangeSplitReader(ORDERS, "x", batch_rows=0)


def test_aware_and_naive_times_from_postgres(connection: FakeConnection) -> None:
    plus_two = timezone(timedelta(hours=2))
    connection.rows = [
        (10, "eu", 1, datetime(2026, 1, 1, 2, tzinfo=plus_two), None, 1, None, None, None,
         datetime(2026, 1, 1, 2, tzinfo=plus_two), None, None),
    ]  # fmt: skip
    [row] = rows_of(read(10))
    assert row["placed_at"] == T0 and row["shipped"] == datetime(2026, 1, 1)
