"""BatchLookup against a real Postgres, inside a real AsyncWaitOperator on a real mailbox.

Tables of their own per module (a composite ``(tenant_id, id)`` key, a ``code text`` key with
``numeric(12,6)``, ``varchar``, ``uuid``, date and timestamp columns, a ``(day, starts)`` key
of a date and a timestamp) and per test where a test changes rows. Batches are fed through
the operator by mails; the operator's timers (timeouts, FLIP-234 retry delays) run on a
ManualTimerService, so a retry happens exactly when the test advances the clock. Where a
query must stay in flight, a second connection holds a lock on the table until the test
releases it. Every wait is bounded.
"""

from __future__ import annotations

import asyncio
import secrets
import uuid
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping, Sequence
from contextlib import asynccontextmanager
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from typing import Any

import asyncpg
import pyarrow as pa
import pytest

from enumerator_service import ConfigError, asyncpg_dsn
from spark_jobs import FileSource, FullCache, Lookup, PartialCache, Pipeline, RetryOnMiss
from spark_jobs.async_io import NO_RETRY, AsyncRetryStrategy, AsyncWaitOperator, Output, OutputMode
from spark_jobs.jobs._outages import is_transient
from spark_jobs.lookup import BatchLookup, miss_retry_strategy
from spark_jobs.lookup import _connections as connections_module
from spark_jobs.pipeline._plan import LookupPlan
from spark_jobs.pipeline._types import UTC_MICROS
from spark_jobs.runtime import MAX_PRIORITY, MailboxController, MailboxProcessor, ManualTimerService
from spark_jobs.source._batch import OFFSET, Batch, with_offsets

TIMEOUT = 10.0
T0 = datetime(2020, 5, 17, 3, 4, 5, 123456, tzinfo=UTC)
REF = uuid.UUID("12345678-1234-5678-1234-567812345678")
ORDERS = {"tenant_id": "int64", "customer_id": "int64", "amount": "decimal(10,2)"}
PAYMENTS = {"code": "string", "paid": "float64"}
ACCOUNT_TYPES = {"name": pa.string(), "opened": UTC_MICROS, "since": pa.date32()}
CODE_TYPES = {
    "rate": pa.decimal128(12, 6),
    "label": pa.string(),
    "ref": pa.string(),
    "valid": pa.date32(),
    "updated": pa.timestamp("us"),
}


def account(tenant: int, customer: int) -> tuple[int, int, str | None, datetime, date]:
    name = None if (tenant, customer) == (2, 5) else f't{tenant}-c{customer}, "q" ü'
    return (
        tenant,
        customer,
        name,
        T0 + timedelta(days=tenant, microseconds=customer),
        date(2020, 1, customer),
    )


CODES = [
    ("EUR", Decimal("1.085000"), "euro", REF, date(2021, 1, 1), datetime(2021, 1, 1, 12, 0, 0, 1)),
    ("USD", Decimal("1.000000"), "dollar", None, date(2021, 1, 2), datetime(2021, 1, 2)),
    ('JPY ü "q"', Decimal("0.006543"), "yen\nnew line", None, None, None),
    ("GBP", None, None, None, None, None),
]
#: Inserted by SQL: infinite date and timestamp (asyncpg reads the date as date.max).
INFINITE = ("XAU", None, None, None, date.max, None)


# -- tables ---------------------------------------------------------------------------------


class Tables:
    def __init__(self, db_url: str) -> None:
        self.dsn = asyncpg_dsn(db_url)
        suffix = secrets.token_hex(3)
        self.accounts = f"lb_accounts_{suffix}"
        self.codes = f"lb_codes_{suffix}"
        self.slots = f"lb_slots_{suffix}"


async def create_accounts(conn: asyncpg.Connection, name: str) -> None:
    await conn.execute(
        f"CREATE TABLE public.{name} (tenant_id bigint, id bigint, name text, "
        "opened timestamptz, since date, PRIMARY KEY (tenant_id, id))"
    )
    rows = [account(t, c) for t in range(1, 4) for c in range(1, 6)]
    await conn.copy_records_to_table(name, records=rows)


async def _create(tables: Tables) -> None:
    conn = await asyncpg.connect(tables.dsn)
    try:
        await create_accounts(conn, tables.accounts)
        await conn.execute(
            f"CREATE TABLE public.{tables.codes} (code text PRIMARY KEY, rate numeric(12,6), "
            "label varchar(20), ref uuid, valid date, updated timestamp)"
        )
        await conn.copy_records_to_table(tables.codes, records=CODES)
        await conn.execute(
            f"INSERT INTO public.{tables.codes} VALUES "
            "('XAU', NULL, NULL, NULL, 'infinity', 'infinity')"
        )
        await conn.execute(
            f"CREATE TABLE public.{tables.slots} (day date, starts timestamp, label text, "
            "PRIMARY KEY (day, starts))"
        )
        await conn.copy_records_to_table(
            tables.slots,
            records=[(date(2020, 5, 17), T0.replace(tzinfo=None), "morning")],
        )
        await conn.execute(
            f"CREATE TABLE public.{tables.slots}_chars (code character(4) PRIMARY KEY, label text)"
        )
        await conn.execute(f"INSERT INTO public.{tables.slots}_chars VALUES ('ab', 'padded')")
    finally:
        await conn.close()


@pytest.fixture(scope="module")
def tables(db_url: str) -> Iterator[Tables]:
    tables = Tables(db_url)
    asyncio.run(_create(tables))
    yield tables

    async def drop() -> None:
        conn = await asyncpg.connect(tables.dsn)
        try:
            await conn.execute(
                f"DROP TABLE public.{tables.accounts}, public.{tables.codes}, "
                f"public.{tables.slots}, public.{tables.slots}_chars"
            )
        finally:
            await conn.close()

    asyncio.run(drop())


@pytest.fixture
def accounts(tables: Tables) -> Iterator[str]:
    """A fresh accounts table for a test that changes rows."""
    name = f"lb_accounts_{secrets.token_hex(3)}"

    async def run(action: Callable[[asyncpg.Connection], Awaitable[None]]) -> None:
        conn = await asyncpg.connect(tables.dsn)
        try:
            await action(conn)
        finally:
            await conn.close()

    asyncio.run(run(lambda conn: create_accounts(conn, name)))
    yield name
    asyncio.run(run(lambda conn: conn.execute(f"DROP TABLE IF EXISTS public.{name}")))


async def execute(tables: Tables, sql: str) -> None:
    conn = await asyncpg.connect(tables.dsn)
    try:
        await conn.execute(sql)
    finally:
        await conn.close()


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


# -- plans, batches, lookups ------------------------------------------------------------------


def plan_of(step: Lookup, schema: Mapping[str, str]) -> LookupPlan:
    """The validated plan of ``step`` in a pipeline reading ``schema``."""
    pipeline = Pipeline("lb_test", FileSource(dict(schema), partition_by=None), steps=[step])
    stage = pipeline.plan.stages[0]
    assert isinstance(stage, LookupPlan)
    return stage


def account_step(table: str, **options: Any) -> Lookup:
    return Lookup(
        f"public.{table}",
        on={"tenant_id": "tenant_id", "customer_id": "id"},
        columns={"name": "account_name", "opened": "opened", "since": "since"},
        **options,
    )


def batch(
    fields: Mapping[str, str], rows: Sequence[tuple[Any, ...]], start: int = 100, **extra: Any
) -> Batch:
    schema = input_schema(fields)
    columns = {
        name: pa.array([row[i] for row in rows], type=schema.field(name).type)
        for i, name in enumerate(fields)
    }
    records = pa.RecordBatch.from_pydict(columns, schema=schema)
    offsets = list(range(start, start + len(rows)))
    return Batch(7, with_offsets(records, offsets), (start, start + len(rows)), **extra)


def input_schema(fields: Mapping[str, str]) -> pa.Schema:
    plan = plan_of(Lookup("t", on=next(iter(fields)), columns=["x"]), fields)
    return pa.schema([pa.field(c.name, c.type) for c in plan.inputs])


def make_lookup(
    tables: Tables,
    plan: LookupPlan,
    fields: Mapping[str, str],
    types: Mapping[str, pa.DataType],
    **options: Any,
) -> BatchLookup:
    arguments: dict[str, Any] = {"batch_size": 100, "pool_size": 2, **options}
    return BatchLookup(
        plan, tables.dsn, input_schema=input_schema(fields), column_types=types, **arguments
    )


def rows_of(out: Batch) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = out.rows.to_pylist()
    return rows


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


# -- the task: a mailbox, one async wait operator, a virtual clock ---------------------------


class Task:
    """One AsyncWaitOperator around ``lookup`` on a real MailboxProcessor. ``feed`` hands
    batches to the default action (by a mail); the loop ends after ``run``'s driver once
    everything in flight was emitted."""

    def __init__(
        self,
        lookup: BatchLookup,
        *,
        mode: OutputMode = OutputMode.ORDERED,
        timeout: float | None = None,
        retry: AsyncRetryStrategy = NO_RETRY,
        capacity: int = 10,
    ) -> None:
        self.lookup = lookup
        self.processor = MailboxProcessor(self._default_action, debug=True)
        self.timers = ManualTimerService()
        self.timers.bind(self.processor.executor())
        self.out: list[Batch] = []
        self.operator: AsyncWaitOperator[Batch, Batch] = AsyncWaitOperator(
            lookup,
            Output(lambda value, _ts: self.out.append(value), lambda _marker: None),
            self.processor,
            capacity=capacity,
            mode=mode,
            timeout=timeout,
            retry=retry,
            timer_service=self.timers,
        )
        self.inputs: deque[Batch] = deque()
        self.ended = False
        self._waiting: Any = None
        self.loop_task: asyncio.Future[None] | None = None

    def _default_action(self, controller: MailboxController) -> None:
        if not self.inputs:
            self._waiting = controller.suspend_default_action()
            if self.ended:
                self.operator.notify_when_drained(controller.all_actions_completed)
            return
        if not self.operator.has_capacity():
            suspension = controller.suspend_default_action()
            self.operator.notify_when_available(suspension.resume)
            return
        self.operator.process_element(self.inputs.popleft())

    def _post(self, action: Callable[[], None]) -> None:
        def run() -> None:
            action()
            waiting, self._waiting = self._waiting, None
            if waiting is not None:
                waiting.resume()

        self.processor.executor(MAX_PRIORITY).execute(run, "test input")

    def feed(self, *batches: Batch) -> None:
        self._post(lambda: self.inputs.extend(batches))

    async def wait_until(self, condition: Callable[[], bool]) -> None:
        async def poll() -> None:
            while not condition():
                if self.loop_task is not None and self.loop_task.done():
                    self.loop_task.result()
                    raise AssertionError("the mailbox loop ended before the condition held")
                await asyncio.sleep(0.001)

        await asyncio.wait_for(poll(), TIMEOUT)

    async def outputs(self, n: int) -> list[Batch]:
        await self.wait_until(lambda: len(self.out) >= n)
        return self.out[:n]

    def run(self, driver: Callable[[Task], Awaitable[None]]) -> list[Batch]:
        async def main() -> None:
            await self.operator.open()
            self.loop_task = asyncio.ensure_future(self.processor.run_loop())
            try:
                await asyncio.wait_for(driver(self), TIMEOUT)

                def end() -> None:
                    self.ended = True

                self._post(end)
                await asyncio.wait_for(self.loop_task, TIMEOUT)
            finally:
                self.loop_task.cancel()
                await self.operator.close()

        asyncio.run(main())
        return self.out


def run_batches(lookup: BatchLookup, *batches: Batch, **options: Any) -> list[Batch]:
    """Feed ``batches`` through the operator; their outputs in emission order."""

    async def driver(task: Task) -> None:
        task.feed(*batches)
        await task.outputs(len(batches))

    return Task(lookup, **options).run(driver)


# -- joins and miss policies ------------------------------------------------------------------

ORDER_ROWS = [
    (1, 1, Decimal("10.50")),
    (3, 99, Decimal("2.00")),  # no such account
    (None, 2, Decimal("3.00")),  # a null key part never matches
    (2, 5, Decimal("4.00")),  # an account whose name is null
    (1, 1, Decimal("5.00")),
    (3, 4, None),
]
EARLIER: tuple[int, bytes, str] = (1, b"{}", "an earlier step's dead letter")


def enriched(row: tuple[Any, ...], offset: int) -> dict[str, Any]:
    tenant, customer, amount = row
    found = tenant is not None and 1 <= tenant <= 3 and 1 <= customer <= 5
    _t, _c, name, opened, since = account(tenant, customer) if found else (0, 0, None, None, None)
    return {
        "tenant_id": tenant,
        "customer_id": customer,
        "amount": amount,
        "account_name": name,
        "opened": opened,
        "since": since,
        OFFSET: offset,
    }


@pytest.mark.parametrize("on_miss", ["keep", "drop", "dead_letter"])
def test_composite_keys_with_each_miss_policy(tables: Tables, on_miss: str) -> None:
    plan = plan_of(account_step(tables.accounts, on_miss=on_miss), ORDERS)
    lookup = make_lookup(tables, plan, ORDERS, ACCOUNT_TYPES)
    given = batch(ORDERS, ORDER_ROWS, dead=[EARLIER], dropped=5)
    (out,) = run_batches(lookup, given)
    everything = [enriched(row, 100 + i) for i, row in enumerate(ORDER_ROWS)]
    assert out.rows.schema.names == [*ORDERS, "account_name", "opened", "since", OFFSET]
    assert out.rows.schema.field("opened").type == UTC_MICROS
    assert (out.split_id, out.span, out.misses) == (7, (100, 106), 1)
    if on_miss == "keep":
        assert rows_of(out) == everything
        assert (out.dead, out.dropped) == ([EARLIER], 5)
    else:
        assert rows_of(out) == [everything[i] for i in (0, 3, 4, 5)]
    if on_miss == "drop":
        assert (out.dead, out.dropped) == ([EARLIER], 7)
    if on_miss == "dead_letter":
        assert out.dropped == 5
        table = f"public.{tables.accounts}"
        assert out.dead == [
            EARLIER,
            (
                101,
                b'{"tenant_id":3,"customer_id":99,"amount":"2.00"}',
                f"lookup miss: {table} has no row for tenant_id=3, customer_id=99",
            ),
            (
                102,
                b'{"tenant_id":null,"customer_id":2,"amount":"3.00"}',
                f"lookup miss: {table} has no row for tenant_id=null, customer_id=2",
            ),
        ]
    assert given.dead == [EARLIER] and given.dropped == 5  # the input is never changed
    metrics = lookup.metrics()
    assert (metrics.lookups, metrics.batches, metrics.keys_queried) == (6, 1, 4)
    assert metrics.rows_fetched == 3
    assert 0 < metrics.p50_ms <= metrics.p99_ms


def test_a_composite_key_is_probed_through_its_index_or_joined_without_one(
    tables: Tables,
) -> None:
    """With a btree index beginning with the key's columns the keys are probed one by one
    (the planner hashed the whole table per chunk otherwise); a table without one is joined.
    Both give the same rows."""
    bare = f"{tables.accounts}_bare"

    def looked_up(table: str) -> tuple[list[dict[str, Any]], str]:
        """(the output rows of ORDER_ROWS looked up in ``table``, the lookup's query)."""
        lookup = make_lookup(tables, plan_of(account_step(table), ORDERS), ORDERS, ACCOUNT_TYPES)
        (out,) = run_batches(lookup, batch(ORDERS, ORDER_ROWS))
        assert lookup._shape is not None
        return rows_of(out), lookup._shape.query

    # An index that does not begin with the key's columns (id alone) does not serve probes.
    asyncio.run(
        execute(
            tables,
            f"CREATE TABLE public.{bare} (LIKE public.{tables.accounts});"
            f"INSERT INTO public.{bare} SELECT * FROM public.{tables.accounts};"
            f"CREATE INDEX ON public.{bare} (id)",
        )
    )
    try:
        indexed, probed = looked_up(tables.accounts)
        unindexed, joined = looked_up(bare)
        assert "CROSS JOIN LATERAL" in probed and "OFFSET 0" in probed
        assert "LATERAL" not in joined and " JOIN " in joined
        assert indexed == unindexed == [enriched(row, 100 + i) for i, row in enumerate(ORDER_ROWS)]
        # An index on the key's columns in another order serves the probes too.
        asyncio.run(execute(tables, f"CREATE UNIQUE INDEX ON public.{bare} (id, tenant_id)"))
        reindexed, query = looked_up(bare)
        assert "CROSS JOIN LATERAL" in query
        assert reindexed == indexed
    finally:
        asyncio.run(execute(tables, f"DROP TABLE public.{bare}"))


def test_a_text_key_with_numeric_uuid_date_and_timestamp_columns(tables: Tables) -> None:
    step = Lookup(
        f"public.{tables.codes}", on="code", columns=["rate", "label", "ref", "valid", "updated"]
    )
    plan = plan_of(step, PAYMENTS)
    lookup = make_lookup(tables, plan, PAYMENTS, CODE_TYPES, batch_size=2)
    codes = ["EUR", "usd", 'JPY ü "q"', None, "GBP", "EUR", "USD", "XAU"]
    given = batch(PAYMENTS, [(code, float(i)) for i, code in enumerate(codes)])
    (out,) = run_batches(lookup, given)
    by_code: dict[str | None, tuple[Any, ...]] = {row[0]: row[1:] for row in [*CODES, INFINITE]}
    expected = []
    for i, code in enumerate(codes):
        rate, label, ref, valid, updated = by_code.get(code, (None,) * 5)
        expected.append(
            {"code": code, "paid": float(i), "rate": rate, "label": label,
             "ref": None if ref is None else str(ref), "valid": valid, "updated": updated,
             OFFSET: 100 + i}
        )  # fmt: skip
    assert rows_of(out) == expected
    assert [out.rows.schema.field(name).type for name in CODE_TYPES] == list(CODE_TYPES.values())
    assert out.misses == 1  # "usd": keys are case-sensitive; the null code is no miss to retry
    assert (lookup.batches, lookup.keys_queried) == (3, 6)  # 6 distinct keys, 2 per query


def test_a_date_and_timestamp_key(tables: Tables) -> None:
    fields = {"day": "date", "starts": "timestamp"}
    step = Lookup(f"public.{tables.slots}", on=["day", "starts"], columns={"label": "slot"})
    lookup = make_lookup(tables, plan_of(step, fields), fields, {"label": pa.string()})
    day = date(2020, 5, 17)
    rows = [(day, T0), (day, T0 + timedelta(microseconds=1)), (day + timedelta(days=1), T0)]
    (out,) = run_batches(lookup, batch(fields, rows))
    # The column is a timestamp without time zone: the record's UTC time is compared.
    assert [row["slot"] for row in rows_of(out)] == ["morning", None, None]


def test_a_character_n_key_compares_as_text(tables: Tables) -> None:
    # As in Postgres: the column's padding does not count, the record's trailing spaces do.
    fields = {"code": "string"}
    step = Lookup(f"public.{tables.slots}_chars", on="code", columns=["label"])
    lookup = make_lookup(tables, plan_of(step, fields), fields, {"label": pa.string()})
    (out,) = run_batches(lookup, batch(fields, [("ab",), ("ab  ",), ("abc",)]))
    assert [row["label"] for row in rows_of(out)] == ["padded", None, None]


def test_an_empty_batch_needs_no_query(tables: Tables) -> None:
    plan = plan_of(account_step(tables.accounts), ORDERS)
    lookup = make_lookup(tables, plan, ORDERS, ACCOUNT_TYPES)
    (out,) = run_batches(lookup, batch(ORDERS, []))
    assert out.rows.num_rows == 0
    assert out.rows.schema.names[-1] == OFFSET
    assert lookup.batches == 0


# -- caches -----------------------------------------------------------------------------------


def test_the_partial_cache_answers_until_entries_expire(tables: Tables, accounts: str) -> None:
    clock = FakeClock()
    step = account_step(accounts, cache=PartialCache(max_rows=100, expire_after_write="60s"))
    lookup = make_lookup(tables, plan_of(step, ORDERS), ORDERS, ACCOUNT_TYPES, clock=clock)

    def names(out: Batch) -> list[Any]:
        return [row["account_name"] for row in rows_of(out)]

    async def driver(task: Task) -> None:
        task.feed(batch(ORDERS, [(1, 1, None), (1, 2, None), (3, 99, None)]))
        (first,) = await task.outputs(1)
        assert names(first) == [account(1, 1)[2], account(1, 2)[2], None]
        assert (lookup.batches, lookup.keys_queried) == (1, 3)
        assert lookup.cache is not None and len(lookup.cache) == 3  # two rows and a miss
        await execute(tables, f"UPDATE public.{accounts} SET name = 'renamed' WHERE id = 1")
        clock.now = 59.0
        task.feed(batch(ORDERS, [(1, 1, None), (3, 99, None), (1, 3, None)]))
        (_, second) = await task.outputs(2)
        assert names(second) == [account(1, 1)[2], None, account(1, 3)[2]]  # cached
        assert (lookup.batches, lookup.keys_queried) == (2, 4)  # only (1, 3) was queried
        clock.now = 60.0
        task.feed(batch(ORDERS, [(1, 1, None)]))
        await task.outputs(3)
        task.feed(batch(ORDERS, [(1, 1, None)]))
        (_, _, third, fourth) = await task.outputs(4)
        assert names(third) == names(fourth) == ["renamed"]
        assert lookup.batches == 3  # expired once, then cached again

    run_lookup = Task(lookup)
    run_lookup.run(driver)
    metrics = lookup.metrics()
    assert (metrics.cache_hits, metrics.cache_misses) == (3, 5)


def test_the_full_cache_joins_without_queries_and_reloads(tables: Tables, accounts: str) -> None:
    step = account_step(accounts, cache=FullCache(reload_every=0.02))
    lookup = make_lookup(tables, plan_of(step, ORDERS), ORDERS, ACCOUNT_TYPES)
    rows = [(1, 1, None), (3, 99, None), (None, 1, None)]

    def names(out: Batch) -> list[Any]:
        return [row["account_name"] for row in rows_of(out)]

    async def driver(task: Task) -> None:
        assert lookup.rows_fetched == 15  # the whole table, loaded by open()
        task.feed(batch(ORDERS, rows))
        (first,) = await task.outputs(1)
        assert names(first) == [account(1, 1)[2], None, None]
        assert first.misses == 1
        await execute(tables, f"UPDATE public.{accounts} SET name = 'renamed' WHERE id = 1")
        reloads = lookup.reloads
        await task.wait_until(lambda: lookup.reloads >= reloads + 2)  # one started after it
        task.feed(batch(ORDERS, rows))
        (_, second) = await task.outputs(2)
        assert names(second) == ["renamed", None, None]
        # A failing reload is logged and retried; the loaded table keeps serving.
        await execute(tables, f"ALTER TABLE public.{accounts} RENAME TO {accounts}_away")
        await task.wait_until(lambda: lookup.reload_failures >= 2)
        task.feed(batch(ORDERS, rows))
        (_, _, third) = await task.outputs(3)
        assert names(third) == ["renamed", None, None]
        await execute(tables, f"ALTER TABLE public.{accounts}_away RENAME TO {accounts}")
        reloads = lookup.reloads
        await task.wait_until(lambda: lookup.reloads > reloads)

    Task(lookup).run(driver)
    assert lookup.batches == 0  # never a query per batch
    assert (lookup.cache_hits, lookup.cache_misses) == (3, 6)  # per row
    assert lookup.reload_failures >= 2
    assert lookup._reloader is not None and not lookup._reloader.running  # close() stopped it


def test_the_full_cache_is_loaded_in_chunks(
    tables: Tables, accounts: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from spark_jobs.lookup import _batch_lookup

    monkeypatch.setattr(_batch_lookup, "LOAD_CHUNK_ROWS", 4)  # 15 rows: 4 chunks
    plan = plan_of(account_step(accounts, cache=FullCache()), ORDERS)
    lookup = make_lookup(tables, plan, ORDERS, ACCOUNT_TYPES)
    (out,) = run_batches(lookup, batch(ORDERS, ORDER_ROWS))
    assert rows_of(out) == [enriched(row, 100 + i) for i, row in enumerate(ORDER_ROWS)]
    assert (lookup.rows_fetched, lookup.batches) == (15, 0)


# -- FLIP-234: retry on a miss -----------------------------------------------------------------


def test_a_retry_finds_a_row_inserted_after_the_first_miss(tables: Tables, accounts: str) -> None:
    step = account_step(
        accounts,
        on_miss=RetryOnMiss(attempts=2, delay="1s", then="dead_letter"),
        timeout="10s",
        cache=PartialCache(max_rows=100),
    )
    plan = plan_of(step, ORDERS)
    lookup = make_lookup(tables, plan, ORDERS, ACCOUNT_TYPES)
    retry = miss_retry_strategy(plan, is_transient)
    assert (retry.max_attempts, retry.backoff(1)) == (2, 1.0)

    async def driver(task: Task) -> None:
        task.feed(batch(ORDERS, [(1, 1, None), (3, 99, None)]))
        await task.wait_until(lambda: task.operator.retries == 1)
        assert task.out == [] and lookup.batches == 1
        await execute(
            tables,
            f"INSERT INTO public.{accounts} VALUES (3, 99, 'late', '2020-01-01', '2020-01-01')",
        )
        task.timers.advance(1.0)
        (first,) = await task.outputs(1)
        assert [row["account_name"] for row in rows_of(first)] == [account(1, 1)[2], "late"]
        assert (first.misses, first.dead) == (0, [])
        assert lookup.batches == 2  # the miss was not cached: queried again; (1, 1) was
        # A key that never arrives: every attempt misses, the last one's dead letter stays.
        task.feed(batch(ORDERS, [(2, 1, None), (3, 98, None)], start=200))
        await task.wait_until(lambda: task.operator.retries == 2)
        task.timers.advance(1.0)
        await task.wait_until(lambda: task.operator.retries == 3)
        assert len(task.out) == 1
        task.timers.advance(1.0)
        (_, second) = await task.outputs(2)
        assert [row["account_name"] for row in rows_of(second)] == [account(2, 1)[2]]
        assert second.misses == 1
        assert second.dead == [
            (
                201,
                b'{"tenant_id":3,"customer_id":98,"amount":null}',
                f"lookup miss: public.{accounts} has no row for tenant_id=3, customer_id=98",
            )
        ]

    Task(lookup, timeout=plan.timeout, retry=retry).run(driver)
    assert lookup.batches == 5


def test_without_retry_attempts_there_is_no_miss_retry(tables: Tables) -> None:
    plan = plan_of(account_step(tables.accounts), ORDERS)
    assert miss_retry_strategy(plan, is_transient) is NO_RETRY


# -- ordered and unordered output --------------------------------------------------------------


@pytest.mark.parametrize("mode", [OutputMode.ORDERED, OutputMode.UNORDERED])
def test_a_batch_answered_by_the_cache_overtakes_a_query_only_when_unordered(
    tables: Tables, mode: OutputMode
) -> None:
    step = Lookup(f"public.{tables.codes}", on="code", columns=["label"], cache=PartialCache(10))
    lookup = make_lookup(tables, plan_of(step, PAYMENTS), PAYMENTS, {"label": pa.string()})

    async def driver(task: Task) -> None:
        task.feed(batch(PAYMENTS, [("EUR", 1.0)], start=100))
        await task.outputs(1)
        async with table_locked(tables, tables.codes):
            task.feed(batch(PAYMENTS, [("USD", 2.0)], start=200))  # queried: blocked
            task.feed(batch(PAYMENTS, [("EUR", 3.0)], start=300))  # a cache hit
            await task.wait_until(lambda: lookup.lookups == 2 and lookup.batches == 2)
            if mode is OutputMode.UNORDERED:
                await task.outputs(2)
            for _ in range(20):
                await asyncio.sleep(0)
            assert len(task.out) == (2 if mode is OutputMode.UNORDERED else 1)
        await task.outputs(3)

    out = Task(lookup, mode=mode).run(driver)
    order = [o.span[0] for o in out]
    assert order == ([100, 300, 200] if mode is OutputMode.UNORDERED else [100, 200, 300])
    assert [rows_of(o)[0]["label"] for o in out] == (
        ["euro", "euro", "dollar"] if mode is OutputMode.UNORDERED else ["euro", "dollar", "euro"]
    )


# -- errors ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "columns", "table", "problem"),
    [
        (
            {**ORDERS, "customer_id": "string"},
            ["name"],
            None,
            "key field customer_id is string but public.{table}.id is bigint: the types must be "
            "of one family",
        ),
        (ORDERS, ["name", "nope"], None, "lookup table public.{table} has no column nope"),
        (ORDERS, ["name"], "lb_no_such_table", "lookup table public.{table} does not exist"),
    ],
)
def test_open_fails_with_one_line_naming_the_step(
    tables: Tables,
    fields: dict[str, str],
    columns: list[str],
    table: str | None,
    problem: str,
) -> None:
    name = table or tables.accounts
    step = Lookup(
        f"public.{name}", on={"tenant_id": "tenant_id", "customer_id": "id"}, columns=columns
    )
    lookup = make_lookup(tables, plan_of(step, fields), fields, {"name": pa.string()})

    async def scenario() -> None:
        with pytest.raises(ConfigError) as failure:
            await lookup.open()
        message = str(failure.value)
        assert message == f"step 1 (Lookup public.{name}): " + problem.format(table=name)
        assert "\n" not in message
        loop = id(asyncio.get_running_loop())
        assert not [key for key in connections_module._pools if key[1] == loop]

    asyncio.run(scenario())


def test_a_looked_up_column_whose_type_changed_since_the_run_resolved_it(tables: Tables) -> None:
    plan = plan_of(account_step(tables.accounts), ORDERS)
    lookup = make_lookup(tables, plan, ORDERS, {**ACCOUNT_TYPES, "since": pa.string()})
    with pytest.raises(
        ConfigError, match="since is now date \\(date\\); the run resolved it as string"
    ):
        asyncio.run(lookup.open())
