"""Dimension lookups for whole Arrow record batches: one query per batch, column-wise results.

:class:`PostgresLookup` enriches one record per ``async_invoke``; at a few hundred thousand
records a second the per-record Python work (a request, a future, an asyncpg ``Record`` per
row, a joined tuple) was most of a subtask's CPU. :class:`ArrowBatchLookup` takes a batch of
rows (the async operator's element is then a batch) and:

1. takes the batch's distinct keys (Arrow ``unique``) and, with a cache, answers what it can;
2. queries the rest with ``SELECT array_agg(key), array_agg(col) … WHERE key = ANY($1)``, at
   most ``max_batch_size`` keys per query, the queries of a batch concurrently on the pool:
   one result row of arrays instead of one asyncpg Record per dimension row;
3. joins with Arrow compute (``index_in`` + ``take``): a key without a row gets nulls (left
   join), and ``joiner(value, rows, columns)`` builds the output from the batch's rows and
   the looked-up columns aligned with them.

A batch whose rows are not in memory (``rows_of`` gives None: restored from a checkpoint as a
byte range) is loaded first by ``load`` on the loop's default executor (a blocking file read).

The cache, when given, keeps Flink's partial-cache semantics per key (``LookupCache``: max
rows, expiry, missing keys cached); it costs a Python dictionary operation per distinct key.

Threading contract: lives on one asyncio event loop, the mailbox thread's; ``open``/``close``
and ``async_invoke`` run there, and every result future is completed there (from the task
that serves the batch). ``load`` runs on an executor thread and must not touch task state.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from time import perf_counter
from typing import Any, TypeVar

import asyncpg
import pyarrow as pa
import pyarrow.compute as pc

from enumerator_service import validate_identifier
from spark_jobs.async_io import ResultFuture
from spark_jobs.lookup._cache import LookupCache
from spark_jobs.lookup._pooled import PooledLookup, column_types

__all__ = ["ArrowBatchLookup"]

IN = TypeVar("IN")
OUT = TypeVar("OUT")


class ArrowBatchLookup(PooledLookup[IN, OUT]):
    """Look up the ``key_field`` column of each batch in ``schema.table`` (``key_column``)
    and hand ``columns`` of the matching rows, aligned with the batch, to ``joiner``.

    ``types`` are the Arrow types of ``columns`` in the output. Identifiers are validated,
    keys are bound parameters; the key column's SQL type is read from the catalog at
    ``open()``, which fails with a ConfigError naming a missing table or column. ``latency``
    seconds are slept per query while holding the connection (benchmarks); ``query_timeout``
    fails a slower query. A failed query fails the batch (the operator may retry it).
    """

    def __init__(
        self,
        dsn: str,
        *,
        schema: str,
        table: str,
        key_column: str,
        columns: Sequence[str],
        types: Sequence[pa.DataType],
        key_field: str,
        rows_of: Callable[[IN], pa.RecordBatch | None],
        load: Callable[[IN], pa.RecordBatch],
        joiner: Callable[[IN, pa.RecordBatch, list[pa.Array]], OUT],
        max_batch_size: int = 4096,
        pool_size: int = 4,
        cache: LookupCache[Any, tuple[Any, ...]] | None = None,
        latency: float = 0.0,
        query_timeout: float | None = None,
    ) -> None:
        for value, what in ((schema, "schema"), (table, "table"), (key_column, "key_column")):
            validate_identifier(value, what)
        for column in columns:
            validate_identifier(column, "columns")
        if len(types) != len(columns):
            raise ValueError("one Arrow type per looked-up column is required")
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be at least 1, got {max_batch_size}")
        if latency < 0:
            raise ValueError("latency must not be negative")
        super().__init__(dsn, pool_size)
        self._schema, self._table = schema, table
        self._key_column, self._columns, self._types = key_column, tuple(columns), list(types)
        self._key_field = key_field
        self._rows_of, self._load, self._joiner = rows_of, load, joiner
        self._max_batch = max_batch_size
        self._cache, self._latency, self._query_timeout = cache, latency, query_timeout
        self._key_type: pa.DataType | None = None
        self._tasks: set[asyncio.Task[None]] = set()  # asyncio keeps only weak references

    # -- lifecycle (event loop) ----------------------------------------------------------

    async def close(self) -> None:
        # Batches still running belong to a failing task: their results would be dropped.
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._leave_pool()

    async def _build_sql(self, conn: asyncpg.Connection) -> str:
        qualified = f"{self._schema}.{self._table}"
        types = await column_types(conn, qualified, (self._key_column,), self._columns)
        key = self._key_column
        selected = [
            key,
            *(self._select(n, t) for n, t in zip(self._columns, self._types, strict=True)),
        ]
        arrays = ", ".join(f"array_agg({expression})" for expression in selected)
        return f"SELECT {arrays} FROM {qualified} WHERE {key} = ANY($1::{types[key]}[])"

    @staticmethod
    def _select(column: str, kind: pa.DataType) -> str:
        """Timestamps travel as epoch microseconds: asyncpg's datetime decoding was more than
        half of a lookup's client CPU, an int8 array decodes at a fraction of it."""
        if pa.types.is_timestamp(kind) and kind.unit == "us":
            return f"(extract(epoch FROM {column}) * 1000000)::int8"
        return column

    # -- requests (mailbox thread) -------------------------------------------------------

    def async_invoke(self, value: IN, result_future: ResultFuture[OUT]) -> None:
        task = asyncio.get_running_loop().create_task(self._serve(value, result_future))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # -- one batch (a task on the event loop) ---------------------------------------------

    async def _serve(self, value: IN, future: ResultFuture[OUT]) -> None:
        start = perf_counter()
        try:
            given = self._rows_of(value)
            if given is None:
                loop = asyncio.get_running_loop()
                given = await loop.run_in_executor(None, self._load, value)
            rows: pa.RecordBatch = given
            keys = rows.column(self._key_field)
            self._key_type = keys.type
            found = await self._found(pc.unique(keys))
            positions = pc.index_in(keys, value_set=found[0])
            out = self._joiner(value, rows, [column.take(positions) for column in found[1:]])
        except BaseException as exc:  # handed to the operator (retry, or fail the task)
            future.complete_exceptionally(exc)
            if isinstance(exc, asyncio.CancelledError):
                raise
            return
        self.lookups += rows.num_rows
        self._latencies.record_weighted(perf_counter() - start, rows.num_rows)
        future.complete([out])

    async def _found(self, distinct: pa.Array) -> list[pa.Array]:
        """Key column and looked-up columns of the rows found for ``distinct`` keys."""
        cache = self._cache
        hits: list[tuple[Any, ...]] = []
        missing: Any = distinct
        if cache is not None:
            keys = distinct.to_pylist()
            misses = []
            for key, hit in zip(keys, cache.get_many(keys), strict=True):
                if hit is None:
                    misses.append(key)
                elif hit.row is not None:
                    hits.append(hit.row)
            self.cache_hits += len(keys) - len(misses)
            self.cache_misses += len(misses)
            missing = misses
        step = self._max_batch
        parts = await asyncio.gather(
            *(self._query(missing[i : i + step]) for i in range(0, len(missing), step))
        )
        columns = [
            pa.concat_arrays([part[i] for part in parts]) if parts else self._empty(i)
            for i in range(len(self._columns) + 1)
        ]
        if cache is not None:
            self._remember(missing, columns)
            if hits:
                cached = zip(*hits, strict=True)
                columns = [
                    pa.concat_arrays([column, pa.array(values, type=column.type)])
                    for column, values in zip(columns, cached, strict=True)
                ]
        return columns

    def _remember(self, keys: list[Any], columns: list[pa.Array]) -> None:
        """Cache the rows found for ``keys``, and the keys without a row as misses."""
        assert self._cache is not None
        # Timestamps are cached as integers: to_pylist makes a datetime per value (~3 µs).
        rows = list(zip(*(_plain(column).to_pylist() for column in columns), strict=True))
        absent = set(keys).difference(row[0] for row in rows)
        self._cache.put_many([*((row[0], row) for row in rows), *((k, None) for k in absent)])

    def _empty(self, index: int) -> pa.Array:
        return pa.array([], type=self._key_type if index == 0 else self._types[index - 1])

    async def _query(self, keys: Any) -> list[pa.Array]:
        pool, sql = self._pool, self._sql
        if pool is None or sql is None:
            raise RuntimeError("ArrowBatchLookup used before open() or after close()")
        values = keys.to_pylist() if isinstance(keys, pa.Array) else keys
        self.batches += 1
        self.keys_queried += len(values)
        conn = pool.try_acquire() or await pool.acquire()
        try:
            statement = pool.cached(conn, sql) or await pool.prepared(
                conn, sql, self._query_timeout
            )
            if self._latency:
                await asyncio.sleep(self._latency)
            row = await statement.fetchrow(values, timeout=self._query_timeout)
        except BaseException:
            pool.discard(conn)
            raise
        pool.release(conn)
        assert row is not None  # an aggregate without GROUP BY returns one row
        ids = pa.array(row[0] or [], type=self._key_type)
        self.rows_fetched += len(ids)
        return [ids] + [pa.array(row[i + 1] or [], type=kind) for i, kind in enumerate(self._types)]


def _plain(column: pa.Array) -> pa.Array:
    return column.cast(pa.int64()) if pa.types.is_timestamp(column.type) else column
