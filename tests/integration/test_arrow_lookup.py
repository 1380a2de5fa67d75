"""ArrowBatchLookup against a real Postgres: a batch's rows joined column-wise (left join),
repeated and missing keys, several queries per batch, timestamps exact to the microsecond,
awkward text, the partial cache, lazily loaded batches, and a missing table."""

from __future__ import annotations

import asyncio
import secrets
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import pyarrow as pa
import pytest

from enumerator_service import ConfigError, asyncpg_dsn
from spark_jobs.async_io import ResultFuture
from spark_jobs.lookup import ArrowBatchLookup, LookupCache

T0 = datetime(2020, 5, 17, 3, 4, 5, 123456, tzinfo=UTC)
TYPES = [pa.string(), pa.timestamp("us", tz="UTC")]


def user(i: int) -> tuple[int, str | None, datetime | None]:
    name = None if i % 7 == 0 else f'u{i}, "quoted" ü\n'
    when = None if i % 5 == 0 else T0 + timedelta(days=i, microseconds=i)
    return (i, name, when)


@pytest.fixture(scope="module")
def table(db_url: str) -> tuple[str, str]:
    dsn, name = asyncpg_dsn(db_url), f"al_users_{secrets.token_hex(3)}"

    async def create() -> None:
        conn = await asyncpg.connect(dsn)
        try:
            await conn.execute(
                f"CREATE TABLE public.{name} (id bigint PRIMARY KEY, name text, signup timestamptz)"
            )
            await conn.copy_records_to_table(name, records=[user(i) for i in range(1, 301)])
        finally:
            await conn.close()

    asyncio.run(create())
    return dsn, name


class Future(ResultFuture[Any]):
    def __init__(self) -> None:
        self.done: asyncio.Future[Any] = asyncio.get_running_loop().create_future()

    def complete(self, results: Any) -> None:
        self.done.set_result(list(results))

    def complete_exceptionally(self, error: BaseException) -> None:
        self.done.set_exception(error)


def lookup(table: tuple[str, str], **extra: Any) -> ArrowBatchLookup[Any, Any]:
    dsn, name = table
    return ArrowBatchLookup(
        dsn,
        schema="public",
        table=name,
        key_column="id",
        columns=("name", "signup"),
        types=TYPES,
        key_field="user_id",
        rows_of=lambda value: value,
        load=lambda _value: pa.record_batch({"user_id": pa.array([3, 400], pa.int64())}),
        joiner=lambda _value, rows, columns: (rows.column(0).to_pylist(), columns),
        **extra,
    )


async def run(function: ArrowBatchLookup[Any, Any], values: list[Any]) -> list[Any]:
    await function.open()
    try:
        out = []
        for value in values:
            future = Future()
            function.async_invoke(value, future)
            (result,) = await asyncio.wait_for(future.done, 10)
            out.append(result)
        return out
    finally:
        await function.close()


def expected(keys: list[int]) -> list[tuple[Any, Any]]:
    return [user(k)[1:] if 1 <= k <= 300 else (None, None) for k in keys]


def joined(result: Any) -> list[tuple[Any, Any]]:
    _keys, (names, times) = result
    return list(zip(names.to_pylist(), times.to_pylist(), strict=True))


@pytest.mark.parametrize("cache_rows", [0, 50])
def test_rows_are_joined_column_wise_with_nulls_for_missing_keys(
    table: tuple[str, str], cache_rows: int
) -> None:
    first = [5, 7, 7, 1, 999, 300, 42, 5, 0, 14]
    second = [*first, 8, 1000]
    batches = [pa.record_batch({"user_id": pa.array(keys, pa.int64())}) for keys in (first, second)]
    cache = LookupCache[Any, tuple[Any, ...]](cache_rows) if cache_rows else None
    function = lookup(table, max_batch_size=3, cache=cache)
    results = asyncio.run(run(function, batches))
    assert joined(results[0]) == expected(first)
    assert joined(results[1]) == expected(second)
    metrics = function.metrics()
    assert metrics.lookups == len(first) + len(second)
    if cache is None:
        assert metrics.keys_queried == len(set(first)) + len(set(second))
        assert metrics.batches == 3 + 4  # 8 and 10 distinct keys, at most 3 per query
    else:  # the second batch queried only its two new keys (misses are cached too)
        assert metrics.cache_hits == len(set(first))
        assert metrics.keys_queried == len(set(first)) + 2


def test_a_batch_without_rows_is_loaded_first(table: tuple[str, str]) -> None:
    (result,) = asyncio.run(run(lookup(table), [None]))
    assert result[0] == [3, 400]
    assert joined(result) == expected([3, 400])


def test_a_missing_table_is_a_configuration_error(table: tuple[str, str]) -> None:
    function = lookup((table[0], "no_such_table"))
    with pytest.raises(ConfigError, match="does not exist"):
        asyncio.run(function.open())
