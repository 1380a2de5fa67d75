"""Postgres table ranges as a source: the enumerator covers every key once, the reader reads
each range in key order and resumes exactly after its committed key."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pytest
import sqlalchemy as sa

from enumerator_service import (
    Settings,
    SplitAssignment,
    TableRangeEnumerator,
    TableRangeSplit,
    asyncpg_dsn,
)
from enumerator_service._operations import Platform, open_platform
from spark_jobs.source import OFFSET, RecordSchema, SplitRead, TableRangeSplitReader

VALUES = RecordSchema((pa.field("v", pa.string()),), frozenset({"v"}))


@pytest.fixture
def table(make_settings: Any) -> Iterator[tuple[Platform, str]]:
    settings: Settings = make_settings()
    platform = open_platform(settings)
    name = f"orders_{secrets.token_hex(3)}"
    with platform.engine.begin() as conn:
        conn.execute(sa.text(f"CREATE TABLE public.{name} (id bigint PRIMARY KEY, v text)"))
        # Keys with gaps: 1..3000 without multiples of 7.
        conn.execute(
            sa.text(
                f"INSERT INTO public.{name} SELECT g, 'v' || g FROM generate_series(1, 3000) g"
                " WHERE g % 7 <> 0"
            )
        )
    yield platform, name
    with platform.engine.begin() as conn:
        conn.execute(sa.text(f"DROP TABLE public.{name}"))
    platform.close()


def _read(dsn: str, assignments: list[SplitAssignment], batch_rows: int) -> list[int]:
    """The keys read from the assignments, in order (each row's ``v`` checked)."""
    reader = TableRangeSplitReader(VALUES, dsn, batch_rows=batch_rows)
    keys: list[int] = []
    for assignment in assignments:
        reader.open(SplitRead.of(assignment))
        done = False
        while not done:
            block, done = reader.fetch()
            if block is not None:
                assert not block.dead
                keys.extend(block.rows.column(OFFSET).to_pylist())
                assert all(v.startswith("v") for v in block.rows.column("v").to_pylist())
    reader.close()
    return keys


def test_ranges_cover_every_key_once_and_appends_are_picked_up(
    table: tuple[Platform, str],
) -> None:
    platform, name = table
    source = platform.settings.source_name
    enumerator = TableRangeEnumerator(
        platform.engine, source, schema="public", table=name, key_column="id", rows_per_split=500
    )
    first = enumerator.start("run-t")
    assert first.splits_registered >= 5
    enumerator.assign_pending()
    enumerator.add_reader(0)
    assignments = []
    while (a := enumerator.handle_split_request(0)) is not None:
        assignments.append(a)
    assert all(isinstance(a.split, TableRangeSplit) for a in assignments)
    dsn = asyncpg_dsn(platform.url)
    keys = _read(dsn, assignments, batch_rows=97)
    assert keys == [k for k in range(1, 3001) if k % 7]

    with platform.engine.begin() as conn:
        conn.execute(
            sa.text(f"INSERT INTO public.{name} SELECT g, 'v' FROM generate_series(3001, 3100) g")
        )
    tick = enumerator.discover()
    assert tick.splits_registered == 1
    assert enumerator.discover().splits_registered == 0
    enumerator.assign_pending()
    appended = enumerator.handle_split_request(0)
    assert appended is not None
    assert _read(dsn, [appended], batch_rows=1000) == list(range(3001, 3101))


def test_resuming_a_range_reads_exactly_the_rest(table: tuple[Platform, str]) -> None:
    platform, name = table
    split = TableRangeSplit(platform.settings.source_name, f"public.{name}", "id", 100, 400)
    dsn = asyncpg_dsn(platform.url)
    whole = _read(dsn, [SplitAssignment(1, split, 1, 100)], batch_rows=50)
    assert whole == [k for k in range(100, 400) if k % 7]
    for i in (0, 17, len(whole) - 1):
        resumed = _read(dsn, [SplitAssignment(1, split, 2, whole[i] + 1)], batch_rows=50)
        assert resumed == whole[i + 1 :]
