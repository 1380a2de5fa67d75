"""PostgresLookup against a real Postgres: batching, single-flight, cache, composite keys, errors.

The function is driven directly (no operator) inside ``asyncio.run`` with ResultFutures that
record their one completion. Where a query must stay in flight, a second connection holds an
ACCESS EXCLUSIVE lock on the table until the test releases it: deterministic, no sleeps.
"""

from __future__ import annotations

import asyncio
import math
import secrets
from collections.abc import AsyncIterator, Callable, Coroutine, Iterable, Iterator
from contextlib import asynccontextmanager
from decimal import Decimal
from typing import Any

import asyncpg
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from enumerator_service import ConfigError, asyncpg_dsn
from spark_jobs.async_io import ResultFuture
from spark_jobs.lookup import LookupCache, PostgresLookup
from spark_jobs.lookup import _connections as connections_module

USERS = 1000  # ids 1..USERS exist; anything above is a miss
TIMEOUT = 10.0


class Tables:
    def __init__(self, dsn: str) -> None:
        suffix = secrets.token_hex(3)
        self.dsn = dsn
        self.users = f"lk_users_{suffix}"
        self.prices = f"lk_prices_{suffix}"


async def _create(tables: Tables) -> None:
    conn = await asyncpg.connect(tables.dsn)
    try:
        await conn.execute(
            f"CREATE TABLE public.{tables.users} ("
            "id bigint PRIMARY KEY, name text NOT NULL, country text NOT NULL)"
        )
        await conn.copy_records_to_table(
            tables.users,
            records=[(i, f"user_{i}", "DE" if i % 2 else "US") for i in range(1, USERS + 1)],
        )
        await conn.execute(
            f"CREATE TABLE public.{tables.prices} ("
            "region varchar(8), sku bigint, price numeric(10, 2) NOT NULL, "
            "PRIMARY KEY (region, sku))"
        )
        await conn.copy_records_to_table(
            tables.prices,
            records=[
                (region, sku, Decimal(sku) + (1 if region == "eu" else 0))
                for region in ("eu", "us")
                for sku in range(1, 51)
            ]
            + [("eastasia", 1, Decimal(9))],
        )
    finally:
        await conn.close()


async def _drop(tables: Tables) -> None:
    conn = await asyncpg.connect(tables.dsn)
    try:
        await conn.execute(f"DROP TABLE public.{tables.users}, public.{tables.prices}")
    finally:
        await conn.close()


@pytest.fixture(scope="module")
def tables(db_url: str) -> Iterator[Tables]:
    tables = Tables(asyncpg_dsn(db_url))
    asyncio.run(_create(tables))
    yield tables
    asyncio.run(_drop(tables))


class Recorder(ResultFuture[Any]):
    """Records the single completion of one request; a second completion fails the test."""

    def __init__(self) -> None:
        self.future: asyncio.Future[list[Any]] = asyncio.get_running_loop().create_future()

    def complete(self, results: Iterable[Any]) -> None:
        assert not self.future.done(), "completed twice"
        self.future.set_result(list(results))

    def complete_exceptionally(self, error: BaseException) -> None:
        assert not self.future.done(), "completed twice"
        self.future.set_exception(error)


def user_lookup(tables: Tables, **options: Any) -> PostgresLookup[int, tuple[int, Any]]:
    """Joins (id, name or None)."""
    return PostgresLookup(
        tables.dsn,
        schema="public",
        table=tables.users,
        key_column="id",
        columns=("name", "country"),
        key_of=lambda value: value,
        joiner=lambda value, row: (value, None if row is None else row["name"]),
        **options,
    )


def invoke(lookup: PostgresLookup[Any, Any], values: Iterable[Any]) -> list[Recorder]:
    recorders = []
    for value in values:
        recorder = Recorder()
        lookup.async_invoke(value, recorder)
        recorders.append(recorder)
    return recorders


async def results(recorders: list[Recorder]) -> list[Any]:
    """Each recorder's single output, or its exception."""
    done = await asyncio.wait_for(
        asyncio.gather(*(r.future for r in recorders), return_exceptions=True), TIMEOUT
    )
    return [d if isinstance(d, BaseException) else d[0] for d in done]


async def until(condition: Callable[[], bool]) -> None:
    """Yield to the loop until ``condition`` holds (a few iterations, no sleeping)."""
    for _ in range(10_000):
        if condition():
            return
        await asyncio.sleep(0)
    raise AssertionError("condition not reached")


@asynccontextmanager
async def table_locked(tables: Tables, table: str) -> AsyncIterator[None]:
    """Queries on ``table`` block (stay in flight) until the block exits."""
    conn = await asyncpg.connect(tables.dsn)
    try:
        async with conn.transaction():
            await conn.execute(f"LOCK TABLE public.{table} IN ACCESS EXCLUSIVE MODE")
            yield
    finally:
        await conn.close()


def run(scenario: Callable[[], Coroutine[Any, Any, None]]) -> None:
    asyncio.run(scenario())


def expected_user(value: int) -> tuple[int, str | None]:
    return (value, f"user_{value}" if 1 <= value <= USERS else None)


# -- batching -----------------------------------------------------------------------------


@pytest.mark.parametrize(("n", "batch"), [(1000, 100), (250, 100), (7, 256)])
def test_concurrent_keys_go_out_in_full_batches(tables: Tables, n: int, batch: int) -> None:
    async def scenario() -> None:
        lookup = user_lookup(tables, max_batch_size=batch)
        await lookup.open()
        values = list(range(1, n + 1))
        assert await results(invoke(lookup, values)) == [expected_user(v) for v in values]
        assert lookup.batches == math.ceil(n / batch)
        assert lookup.lookups == n
        metrics = lookup.metrics()
        assert metrics.rows_fetched == n
        assert metrics.mean_batch_size == pytest.approx(n / math.ceil(n / batch))
        assert 0 < metrics.p50_ms <= metrics.p99_ms
        await lookup.close()

    run(scenario)


def test_misses_complete_with_a_none_row(tables: Tables) -> None:
    async def scenario() -> None:
        lookup = user_lookup(tables)
        await lookup.open()
        values = [3, USERS + 1, 4, USERS + 50]
        assert await results(invoke(lookup, values)) == [expected_user(v) for v in values]
        assert lookup.batches == 1
        assert lookup.metrics().rows_fetched == 2
        await lookup.close()

    run(scenario)


@settings(max_examples=15, deadline=None)
@given(values=st.lists(st.integers(1, USERS + 20), max_size=60), batch=st.integers(1, 16))
def test_any_mix_of_keys_is_answered_with_one_query_per_full_batch(
    tables: Tables, values: list[int], batch: int
) -> None:
    async def scenario() -> None:
        lookup = user_lookup(tables, max_batch_size=batch, pool_size=2)
        await lookup.open()
        assert await results(invoke(lookup, values)) == [expected_user(v) for v in values]
        assert lookup.batches == math.ceil(len(set(values)) / batch)
        await lookup.close()

    run(scenario)


def test_a_partial_batch_keeps_filling_while_every_connection_is_busy(tables: Tables) -> None:
    async def scenario() -> None:
        lookup = user_lookup(tables, pool_size=1, max_batch_size=10)
        await lookup.open()
        async with table_locked(tables, tables.users):
            first = invoke(lookup, [1])
            await until(lambda: lookup.batches == 1)  # in flight, blocked by the lock
            later = invoke(lookup, range(2, 7))
            for _ in range(5):
                await asyncio.sleep(0)  # the batch is due but the only connection is busy
            later += invoke(lookup, range(7, 10))
        assert await results(first + later) == [expected_user(v) for v in range(1, 10)]
        assert lookup.batches == 2  # 2..9 went out together
        await lookup.close()

    run(scenario)


# -- single-flight ------------------------------------------------------------------------


def test_identical_concurrent_keys_share_one_query(tables: Tables) -> None:
    async def scenario() -> None:
        lookup = user_lookup(tables)
        await lookup.open()
        assert await results(invoke(lookup, [42] * 100)) == [expected_user(42)] * 100
        assert lookup.batches == 1
        assert lookup.metrics().keys_queried == 1
        await lookup.close()

    run(scenario)


def test_a_key_in_flight_is_joined_not_queried_again(tables: Tables) -> None:
    async def scenario() -> None:
        lookup = user_lookup(tables)
        await lookup.open()
        async with table_locked(tables, tables.users):
            first = invoke(lookup, [7])
            await until(lambda: lookup.batches == 1)
            joined = invoke(lookup, [7] * 99 + [8])
            await until(lambda: lookup.batches == 2)  # only key 8 needed a new query
        assert await results(first + joined) == [expected_user(7)] * 100 + [expected_user(8)]
        assert lookup.batches == 2
        await lookup.close()

    run(scenario)


# -- max_linger ---------------------------------------------------------------------------


def test_keys_within_the_linger_window_share_a_batch(tables: Tables) -> None:
    async def scenario() -> None:
        lookup = user_lookup(tables, max_linger=3600.0, max_batch_size=4)
        await lookup.open()
        early = invoke(lookup, [1, 2])
        for _ in range(20):
            await asyncio.sleep(0)  # many loop iterations: with max_linger=0 this would flush
        assert lookup.batches == 0
        early += invoke(lookup, [3, 4])  # fills the batch: sent at once despite the linger
        assert await results(early) == [expected_user(v) for v in (1, 2, 3, 4)]
        assert lookup.batches == 1
        partial = invoke(lookup, [5])
        await lookup.close()  # a lingering batch is sent on close, not dropped
        assert await results(partial) == [expected_user(5)]
        assert lookup.batches == 2

    run(scenario)


def test_a_partial_batch_is_sent_when_the_linger_elapses(tables: Tables) -> None:
    linger = 0.005

    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        lookup = user_lookup(tables, max_linger=linger)
        await lookup.open()
        start = loop.time()
        recorders = invoke(lookup, [1, 2, 3])
        assert await results(recorders) == [expected_user(v) for v in (1, 2, 3)]
        assert loop.time() - start >= linger
        assert lookup.batches == 1
        await lookup.close()

    run(scenario)


# -- cache --------------------------------------------------------------------------------


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_cache_hits_avoid_queries_until_they_expire(tables: Tables) -> None:
    clock = FakeClock()
    cache: LookupCache[Any, Any] = LookupCache(100, expire_after_write=60, clock=clock)

    async def scenario() -> None:
        lookup = user_lookup(tables, cache=cache)
        await lookup.open()
        missing = USERS + 7
        assert await results(invoke(lookup, [5, missing])) == [(5, "user_5"), (missing, None)]
        assert lookup.batches == 1
        assert len(cache) == 2  # the row and the miss
        conn = await asyncpg.connect(tables.dsn)
        try:
            await conn.execute(f"UPDATE public.{tables.users} SET name = 'renamed' WHERE id = 5")
            clock.now = 59.0
            assert await results(invoke(lookup, [5, missing, 5])) == [
                (5, "user_5"),  # still the cached row
                (missing, None),  # a cached miss answers without a query too
                (5, "user_5"),
            ]
            assert lookup.batches == 1
            clock.now = 60.0
            assert await results(invoke(lookup, [5])) == [(5, "renamed")]
            assert lookup.batches == 2
        finally:
            await conn.execute(f"UPDATE public.{tables.users} SET name = 'user_5' WHERE id = 5")
            await conn.close()
        metrics = lookup.metrics()
        assert (metrics.cache_hits, metrics.cache_misses) == (3, 3)
        assert (cache.hits, cache.loads) == (3, 3)
        await lookup.close()

    run(scenario)


def test_misses_are_not_cached_without_cache_missing_key(tables: Tables) -> None:
    cache: LookupCache[Any, Any] = LookupCache(100, cache_missing_key=False)

    async def scenario() -> None:
        lookup = user_lookup(tables, cache=cache)
        await lookup.open()
        for _ in range(2):
            assert await results(invoke(lookup, [USERS + 3])) == [(USERS + 3, None)]
        assert lookup.batches == 2
        assert len(cache) == 0
        await lookup.close()

    run(scenario)


# -- composite keys -----------------------------------------------------------------------


def test_composite_keys_join_on_every_column(tables: Tables) -> None:
    async def scenario() -> None:
        lookup: PostgresLookup[tuple[str, int], Any] = PostgresLookup(
            tables.dsn,
            schema="public",
            table=tables.prices,
            key_column=("region", "sku"),
            columns=("price",),
            key_of=lambda value: value,
            joiner=lambda value, row: None if row is None else (row[0], row[1], row["price"]),
            max_batch_size=3,
        )
        await lookup.open()
        values = [("eu", 1), ("us", 1), ("eu", 50), ("eu", 51), ("asia", 1), ("us", 1)]
        assert await results(invoke(lookup, values)) == [
            ("eu", 1, Decimal("2.00")),
            ("us", 1, Decimal("1.00")),
            ("eu", 50, Decimal("51.00")),
            None,
            None,
            ("us", 1, Decimal("1.00")),
        ]
        assert lookup.batches == 2  # five distinct keys, batches of three
        # A key longer than varchar(8) must not be cast (truncated) into a match in SQL.
        fetched = lookup.rows_fetched
        assert await results(invoke(lookup, [("eastasia-south", 1)])) == [None]
        assert lookup.rows_fetched == fetched
        await lookup.close()

    run(scenario)


# -- errors -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"table": "lk_no_such_table"}, "public.lk_no_such_table does not exist"),
        ({"key_column": "user_id"}, "has no column user_id"),
        ({"columns": ("name", "email")}, "has no column email"),
    ],
)
def test_open_names_a_missing_table_or_column(
    tables: Tables, options: dict[str, Any], message: str
) -> None:
    arguments: dict[str, Any] = {
        "schema": "public",
        "table": tables.users,
        "key_column": "id",
        "columns": ("name",),
        **options,
    }

    async def scenario() -> None:
        lookup: PostgresLookup[int, Any] = PostgresLookup(
            tables.dsn, key_of=lambda v: v, joiner=lambda v, r: r, **arguments
        )
        with pytest.raises(ConfigError, match=message):
            await lookup.open()
        # The pool acquired by open() was given back.
        loop = id(asyncio.get_running_loop())
        assert not [key for key in connections_module._pools if key[1] == loop]

    run(scenario)


def test_invalid_identifiers_are_rejected_before_any_sql(tables: Tables) -> None:
    with pytest.raises(ConfigError, match="key_column"):
        PostgresLookup(
            tables.dsn,
            schema="public",
            table=tables.users,
            key_column=("id", "name; drop table x"),
            columns=(),
            key_of=lambda v: v,
            joiner=lambda v, r: r,
        )


def test_a_failed_query_fails_every_waiter_of_its_batch(tables: Tables) -> None:
    async def scenario() -> None:
        lookup = user_lookup(tables)
        await lookup.open()
        # One value asyncpg cannot encode as bigint fails the whole batch, joined keys too.
        failed = await results(invoke(lookup, [1, 1, "not-a-number", 2]))
        assert all(isinstance(f, asyncpg.DataError) for f in failed)
        # Nothing is left behind: the same keys are queried afresh and succeed.
        assert await results(invoke(lookup, [1, 2])) == [expected_user(1), expected_user(2)]
        await lookup.close()

    run(scenario)


def test_a_dropped_table_fails_the_waiters_with_the_database_error(tables: Tables) -> None:
    table = f"lk_drop_{secrets.token_hex(3)}"

    async def scenario() -> None:
        conn = await asyncpg.connect(tables.dsn)
        await conn.execute(f"CREATE TABLE public.{table} (id bigint PRIMARY KEY, name text)")
        lookup: PostgresLookup[int, Any] = PostgresLookup(
            tables.dsn,
            schema="public",
            table=table,
            key_column="id",
            columns=("name",),
            key_of=lambda v: v,
            joiner=lambda v, r: r,
        )
        await lookup.open()
        await conn.execute(f"DROP TABLE public.{table}")
        await conn.close()
        failed = await results(invoke(lookup, [1, 2, 3, 3]))
        assert all(isinstance(f, asyncpg.UndefinedTableError) for f in failed)
        await lookup.close()

    run(scenario)


def test_a_query_over_its_timeout_fails_and_the_keys_are_queried_afresh(tables: Tables) -> None:
    async def scenario() -> None:
        # 0.2 s: the locked query always runs over it (the lock is held until it fails), and
        # the fresh query after the lock must fit in it on a busy machine too (20 ms did not,
        # in a full suite on 2 cores).
        lookup = user_lookup(tables, query_timeout=0.2)
        await lookup.open()
        async with table_locked(tables, tables.users):
            failed = await results(invoke(lookup, [1, 1, 2]))
        assert all(isinstance(f, TimeoutError) for f in failed)
        assert await results(invoke(lookup, [1, 2])) == [expected_user(1), expected_user(2)]
        assert lookup.batches == 2
        await lookup.close()

    run(scenario)


def test_a_failing_joiner_fails_only_its_own_request(tables: Tables) -> None:
    def joiner(value: int, row: Any) -> int:
        if value == 2:
            raise ValueError("bad row")
        return value

    async def scenario() -> None:
        lookup: PostgresLookup[int, int] = PostgresLookup(
            tables.dsn,
            schema="public",
            table=tables.users,
            key_column="id",
            columns=("name",),
            key_of=lambda v: v,
            joiner=joiner,
        )
        await lookup.open()
        done = await results(invoke(lookup, [1, 2, 3]))
        assert done[0] == 1 and done[2] == 3
        assert isinstance(done[1], ValueError)
        await lookup.close()

    run(scenario)


def test_injected_latency_is_paid_per_round_trip(tables: Tables) -> None:
    latency = 0.005

    async def scenario() -> None:
        lookup = user_lookup(tables, latency=latency)
        await lookup.open()
        assert await results(invoke(lookup, [1, 2])) == [expected_user(1), expected_user(2)]
        assert lookup.metrics().p50_ms >= latency * 1e3
        await lookup.close()

    run(scenario)


def test_reserved_words_work_as_schema_table_and_column_names(tables: Tables) -> None:
    """``"group"."order"`` keyed by ``user`` (and by ``user, select``): every statement of the
    lookup (batch, lone key, composite key) quotes its names."""
    schema = f"group_{secrets.token_hex(3)}"  # a schema of its own, dropped afterwards

    async def scenario() -> None:
        conn = await asyncpg.connect(tables.dsn)
        try:
            await conn.execute(f'CREATE SCHEMA "{schema}"')
            await conn.execute(
                f'CREATE TABLE "{schema}"."order" ("user" bigint, "select" text, "group" text,'
                ' PRIMARY KEY ("user", "select"))'
            )
            await conn.execute(
                f"INSERT INTO \"{schema}\".\"order\" VALUES (1, 'a', 'g1'), (2, 'b', 'g2')"
            )
            single: PostgresLookup[int, Any] = PostgresLookup(
                tables.dsn,
                schema=schema,
                table="order",
                key_column="user",
                columns=("group",),
                key_of=lambda v: v,
                joiner=lambda v, r: None if r is None else r["group"],
            )
            composite: PostgresLookup[tuple[int, str], Any] = PostgresLookup(
                tables.dsn,
                schema=schema,
                table="order",
                key_column=("user", "select"),
                columns=("group",),
                key_of=lambda v: v,
                joiner=lambda v, r: None if r is None else r["group"],
            )
            await single.open()
            await composite.open()
            assert await results(invoke(single, [1, 2, 3])) == ["g1", "g2", None]
            assert await results(invoke(single, [2])) == ["g2"]  # the lone-key statement
            found = await results(invoke(composite, [(1, "a"), (2, "a"), (2, "b")]))
            assert found == ["g1", None, "g2"]
            assert await results(invoke(composite, [(1, "a")])) == ["g1"]
            await single.close()
            await composite.close()
        finally:
            await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
            await conn.close()

    run(scenario)
