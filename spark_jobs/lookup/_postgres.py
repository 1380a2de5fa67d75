"""Dimension lookups in Postgres over asyncpg: micro-batched, single-flight, optionally cached.

Lookups issued while the mailbox thread processes a slice of input are collected into one
batch and sent as one query (``= ANY($1)`` for a single key column, a join against
``unnest($1, $2, …)`` for a composite key) when the batch is full, on the next event-loop
iteration (``max_linger=0``) or ``max_linger`` seconds after its first key. At most
``pool_size`` queries run at once: meanwhile full batches queue, and a partial batch that is
due keeps filling until a connection frees (fewer, fuller queries exactly when the database
is the bottleneck). A key that is already waiting, in the batch being collected or in a
query in flight, joins that request instead of being sent again. Misses complete with
``joiner(value, None)``.

Threading contract: a :class:`PostgresLookup` lives on one asyncio event loop, the mailbox
thread's. ``open``/``close`` run on it and ``async_invoke`` is called on it (never blocks: it
only files the request); every ResultFuture is completed from that thread too.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable, Sequence
from time import perf_counter
from typing import Any, TypeVar

import asyncpg

from enumerator_service import ConfigError, qualified_name, quote_identifier, validate_identifier
from spark_jobs.async_io import ResultFuture
from spark_jobs.lookup._cache import LookupCache
from spark_jobs.lookup._pooled import PooledLookup, column_types

__all__ = ["PostgresLookup"]

IN = TypeVar("IN")
OUT = TypeVar("OUT")


class PostgresLookup(PooledLookup[IN, OUT]):
    """Look up each input's key in ``schema.table`` and join the row (or None) onto it.

    ``key_column`` is one column name (``key_of`` returns the value) or a sequence of names
    (``key_of`` returns a tuple in that order). The joined record holds the key column(s)
    first, then ``columns``. Keys are matched by Python equality of the returned key values,
    and the key should be unique: with several matching rows one of them is joined.

    Keyword-only extras (all optional): ``max_linger`` seconds a partial batch may wait for
    more keys (0: flush on the next loop iteration); ``cache`` answers repeated keys without a
    query and receives every query result; ``latency`` seconds are slept per round trip while
    holding the connection (benchmarks simulate a remote database with it); ``query_timeout``
    seconds fail a query that takes longer (asyncpg cancels it on the server). Because a key in
    flight is joined rather than queried again, a retry after an operator timeout waits for
    the original query: keep ``query_timeout`` below the operator's timeout so that a hung
    query fails and the retry queries afresh.

    Identifiers are validated; key values are always bound parameters. The key columns' SQL
    types are read from the catalog at ``open()``, which fails with a ConfigError naming a
    missing table or column. A failed query completes every waiter of its batch exceptionally.
    """

    def __init__(
        self,
        dsn: str,
        *,
        schema: str,
        table: str,
        key_column: str | Sequence[str],
        columns: Sequence[str],
        key_of: Callable[[IN], Any],
        joiner: Callable[[IN, asyncpg.Record | None], OUT],
        max_batch_size: int = 256,
        pool_size: int = 4,
        max_linger: float = 0.0,
        cache: LookupCache[Any, Any] | None = None,
        latency: float = 0.0,
        query_timeout: float | None = None,
    ) -> None:
        validate_identifier(schema, "schema")
        validate_identifier(table, "table")
        self._tuple_keys = not isinstance(key_column, str)
        key_columns = (key_column,) if isinstance(key_column, str) else tuple(key_column)
        if not key_columns:
            raise ConfigError("key_column", "at least one key column is required")
        for name in key_columns:
            validate_identifier(name, "key_column")
        for column in columns:
            validate_identifier(column, "columns")
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be at least 1, got {max_batch_size}")
        if max_linger < 0 or latency < 0:
            raise ValueError("max_linger and latency must not be negative")
        super().__init__(dsn, pool_size)
        self._schema = schema
        self._table = table
        self._key_columns = key_columns
        self._columns = tuple(columns)
        self._key_of = key_of
        self._joiner = joiner
        self._max_batch = max_batch_size
        self._linger = max_linger
        self._cache = cache
        self._latency = latency
        self._query_timeout = query_timeout
        self._sql_one: str | None = None
        # Every key pending or in flight → its waiters (value, future, perf_counter at invoke).
        # One dict for both states makes single-flight one lookup per invoke, and a key leaves
        # it exactly when its query's result (or failure) is delivered.
        self._waiting: dict[Any, list[tuple[IN, ResultFuture[OUT], float]]] = {}
        self._batch: list[Any] = []  # keys of the batch being collected, in arrival order
        self._flush_handle: asyncio.Handle | None = None
        # At most pool_size queries run; more would only queue inside the pool as many small
        # batches. Instead full batches wait here, and a batch whose linger ran out while all
        # connections were busy stays open (``_batch_due``) and keeps filling until one frees.
        self._running = 0
        self._ready: deque[list[Any]] = deque()
        self._batch_due = False
        # asyncio keeps only weak references to tasks: hold them until they finish.
        self._tasks: set[asyncio.Task[None]] = set()
        self._idle_workers: list[asyncio.Future[list[Any] | None]] = []

    # -- lifecycle (event loop) ----------------------------------------------------------

    async def close(self) -> None:
        # A lingering batch is sent now rather than left behind with futures never completed;
        # workers drain the queued batches, then park and are told to stop.
        self._close_batch()
        while self._ready or self._running:
            await asyncio.sleep(0)
        while self._idle_workers:
            self._idle_workers.pop().set_result(None)
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._leave_pool()

    async def _build_sql(self, conn: asyncpg.Connection) -> str:
        types = await column_types(
            conn, self._schema, self._table, self._key_columns, self._columns
        )
        # Every name quoted (validated in __init__): reserved words work as names.
        qualified = qualified_name(self._schema, self._table)
        keys = [quote_identifier(name) for name in self._key_columns]
        values = [quote_identifier(name) for name in self._columns]
        equal = " AND ".join(f"{name} = ${i}" for i, name in enumerate(keys, 1))
        self._sql_one = f"SELECT {', '.join((*keys, *values))} FROM {qualified} WHERE {equal}"
        if not self._tuple_keys:
            (key,) = keys
            select = ", ".join((key, *values))
            param = types[self._key_columns[0]]
            return f"SELECT {select} FROM {qualified} WHERE {key} = ANY($1::{param}[])"
        select = ", ".join(f"_t.{name}" for name in (*keys, *values))
        arrays = ", ".join(
            f"${i}::{types[name]}[]" for i, name in enumerate(self._key_columns, start=1)
        )
        aliases = ", ".join(keys)
        on = " AND ".join(f"_t.{name} = _q.{name}" for name in keys)
        return (
            f"SELECT {select} FROM unnest({arrays}) AS _q({aliases}) JOIN {qualified} AS _t ON {on}"
        )

    # -- requests (mailbox thread) -------------------------------------------------------

    def async_invoke(self, value: IN, result_future: ResultFuture[OUT]) -> None:
        self.lookups += 1
        start = perf_counter()
        key = self._key_of(value)
        cache = self._cache
        if cache is not None:
            hit = cache.get(key)
            if hit is not None:
                self.cache_hits += 1
                # Completing here only posts a mail: the operator emits it later, in order.
                self._complete(value, result_future, hit.row, start)
                return
            self.cache_misses += 1
        waiters = self._waiting.get(key)
        if waiters is not None:  # single-flight: already pending or in flight
            waiters.append((value, result_future, start))
            return
        self._waiting[key] = [(value, result_future, start)]
        batch = self._batch
        batch.append(key)
        if len(batch) >= self._max_batch:
            self._close_batch()
        elif len(batch) == 1:
            loop = asyncio.get_running_loop()
            self._flush_handle = (
                loop.call_later(self._linger, self._on_linger)
                if self._linger > 0
                else loop.call_soon(self._on_linger)
            )

    def _complete(self, value: IN, future: ResultFuture[OUT], row: Any, start: float) -> None:
        try:
            out = self._joiner(value, row)
        except Exception as exc:
            future.complete_exceptionally(exc)
            return
        future.complete([out])
        self._latencies.record(perf_counter() - start)

    def _on_linger(self) -> None:
        self._flush_handle = None
        if self._running < self._pool_size:
            self._close_batch()
        else:
            self._batch_due = True  # keeps filling; sent when a query finishes

    def _close_batch(self) -> None:
        """Close the open batch (if any): start its query, or queue it while all are busy."""
        if self._flush_handle is not None:
            # The timer must not cut the next batch's linger window short.
            self._flush_handle.cancel()
            self._flush_handle = None
        self._batch_due = False
        keys = self._batch
        if not keys:
            return
        self._batch = []
        if self._running < self._pool_size:
            self._start(keys)
        else:
            self._ready.append(keys)

    def _start(self, keys: list[Any]) -> None:
        self._running += 1
        if self._idle_workers:
            self._idle_workers.pop().set_result(keys)
            return
        # One long-lived worker per connection in use: no task per query.
        task = asyncio.get_running_loop().create_task(self._worker(keys))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _worker(self, keys: list[Any] | None) -> None:
        """Run batches until parked and told to stop; the query is inlined on purpose (a
        coroutine frame per query is measurable at per-row rates)."""
        loop = asyncio.get_running_loop()
        while keys is not None:
            try:
                pool, sql, sql_one = self._pool, self._sql, self._sql_one
                if pool is None or sql is None or sql_one is None:
                    raise RuntimeError("PostgresLookup used before open() or after close()")
                self.batches += 1
                self.keys_queried += len(keys)
                args: Sequence[Any]
                if len(keys) == 1:
                    # A lone key takes the plain "key = $1" statement: cheaper on both sides.
                    sql, args = sql_one, keys[0] if self._tuple_keys else keys
                else:
                    # Composite keys travel as one array per key column (transposed tuples).
                    args = list(zip(*keys, strict=True)) if self._tuple_keys else (keys,)
                conn = pool.try_acquire() or await pool.acquire()
                try:
                    statement = pool.cached(conn, sql) or await pool.prepared(
                        conn, sql, self._query_timeout
                    )
                    if self._latency:
                        await asyncio.sleep(self._latency)
                    rows = await statement.fetch(*args, timeout=self._query_timeout)
                except BaseException:
                    pool.discard(conn)
                    raise
                pool.release(conn)
            except asyncio.CancelledError as exc:
                self._fail(keys, exc)
                raise
            except Exception as exc:
                self._fail(keys, exc)
            else:
                self._deliver(keys, rows)
            # The connection is free again: take the next batch straight away.
            if self._ready:
                keys = self._ready.popleft()
            elif self._batch_due and self._batch:
                keys = self._take_batch()
            else:
                self._running -= 1
                parked: asyncio.Future[list[Any] | None] = loop.create_future()
                self._idle_workers.append(parked)
                keys = await parked  # a batch, or None when the lookup closes

    def _take_batch(self) -> list[Any]:
        if self._flush_handle is not None:
            self._flush_handle.cancel()
            self._flush_handle = None
        self._batch_due = False
        keys, self._batch = self._batch, []
        return keys

    # -- queries (event loop) ------------------------------------------------------------

    def _deliver(self, keys: list[Any], rows: list[asyncpg.Record]) -> None:
        self.rows_fetched += len(rows)
        found: dict[Any, asyncpg.Record]
        if len(keys) == 1:  # a per-row query: its only row (if any) is the key's
            found = {keys[0]: rows[0]} if rows else {}
        elif self._tuple_keys:
            width = len(self._key_columns)
            found = {row[:width]: row for row in rows}
        else:
            found = {row[0]: row for row in rows}
        cache, joiner, pop = self._cache, self._joiner, self._waiting.pop
        elapsed: list[float] = []
        took = elapsed.append
        # One timestamp for the whole batch: its waiters complete within microseconds.
        now = perf_counter()
        for key in keys:
            row = found.get(key)
            if cache is not None:
                cache.put(key, row)
            for value, future, start in pop(key):
                try:
                    out = joiner(value, row)
                except Exception as exc:
                    future.complete_exceptionally(exc)
                    continue
                future.complete([out])
                took(now - start)
        if len(elapsed) == 1:
            self._latencies.record(elapsed[0])
        else:
            self._latencies.record_many(elapsed)

    def _fail(self, keys: list[Any], error: BaseException) -> None:
        pop = self._waiting.pop
        for key in keys:
            for _, future, _start in pop(key):
                future.complete_exceptionally(error)
