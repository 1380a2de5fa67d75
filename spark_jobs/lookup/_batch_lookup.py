"""``BatchLookup``: the ``Lookup`` step for any table, key and schema, one batch per element.

Each element is a :class:`~spark_jobs.source.Batch`. Per batch:

1. the batch's distinct keys (rows with a null key part never match) are answered by the
   partial cache where there is one, the rest queried in chunks of ``batch_size`` keys,
   the chunks concurrently on the worker's pool (one result row of arrays per query); with
   the full cache the whole table is in Arrow and nothing is queried;
2. the rows found are joined back with Arrow compute (``_batch_join``), giving exactly one
   output batch: the input's user fields, the looked-up columns under their output names,
   the offset column last; then the miss policy (keep, drop, dead letter).

FLIP-234 retry on miss (``plan.retry_attempts``) belongs to the operator: wrap the step in
``AsyncWaitOperator(..., retry=miss_retry_strategy(plan, is_transient))``. The operator
invokes the whole input batch again after the delay while its output still has ``misses``;
every attempt applies the miss policy, the last attempt's output is the one emitted, and
misses are never cached meanwhile.

Threading contract: a BatchLookup lives on one asyncio event loop, the task's mailbox
thread. ``open``/``close``/``reload`` run there, ``async_invoke`` is called there and never
blocks (queries run as tasks on the loop; batches answered without a query complete at
once), and every result future is completed on that thread. Counters are plain attributes.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping, Sequence
from time import perf_counter
from typing import Any

import asyncpg
import pyarrow as pa
import pyarrow.compute as pc

from spark_jobs.async_io import NO_RETRY, AsyncRetryStrategy, ResultFuture, fixed_delay
from spark_jobs.lookup._batch_cache import Answer, BatchCache
from spark_jobs.lookup._batch_join import Found, Joiner, distinct_keys, join_keys, match
from spark_jobs.lookup._batch_sql import KeyPart, LookupShape, ValueColumn, read_shape
from spark_jobs.lookup._cache_index import cache_keys
from spark_jobs.lookup._connections import CONNECT_PATIENCE
from spark_jobs.lookup._full_cache import LOAD_CHUNK_ROWS, Reloader, load_table, to_found
from spark_jobs.lookup._hit_rate_guard import HitRateGuard
from spark_jobs.lookup._pooled import PooledLookup
from spark_jobs.pipeline._plan import LookupPlan
from spark_jobs.source._batch import Batch

__all__ = ["BatchLookup", "miss_retry_strategy"]


def miss_retry_strategy(
    plan: LookupPlan, transient: Callable[[BaseException], bool]
) -> AsyncRetryStrategy:
    """FLIP-234 retry on miss for ``plan`` (``NO_RETRY`` without ``retry_attempts``): up to
    ``retry_attempts`` more attempts ``retry_delay`` apart while the output batch has misses,
    or after an error ``transient`` accepts. The operator needs a timeout above
    ``retry_attempts * retry_delay`` (it spans all attempts)."""
    if plan.retry_attempts < 1:
        return NO_RETRY
    return fixed_delay(
        plan.retry_attempts, plan.retry_delay, on_result=_has_misses, on_exception=transient
    )


def _has_misses(results: Sequence[Any]) -> bool:
    return any(result.misses > 0 for result in results)


class BatchLookup(PooledLookup[Batch, Batch]):
    """Enrich batches with the columns of ``plan``'s table (see the module docstring).

    ``input_schema``: the records reaching the step (user fields; the offset column may be
    included, last). ``column_types``: the looked-up columns' Arrow types as the run resolved
    them (``catalog_arrow_type``); ``open()`` checks the catalog still agrees. ``query_timeout``
    fails a slower query (and a full-cache chunk fetch); ``latency`` seconds are slept per
    query while holding the connection (benchmarks); ``clock`` drives the partial cache's
    expiry. A failed query fails the batch (the operator may retry it).

    Metrics: ``lookups`` rows, ``batches`` queries, ``keys_queried`` distinct keys sent,
    ``rows_fetched``; ``cache_hits``/``cache_misses`` count distinct keys with the partial
    cache and rows with the full cache; ``reloads``/``reload_failures`` the full cache's.
    """

    def __init__(
        self,
        plan: LookupPlan,
        dsn: str,
        *,
        input_schema: pa.Schema,
        column_types: Mapping[str, pa.DataType],
        batch_size: int,
        pool_size: int,
        query_timeout: float | None = None,
        latency: float = 0.0,
        clock: Callable[[], float] = time.monotonic,
        where: str = "",
        patience: float = CONNECT_PATIENCE,
    ) -> None:
        if not plan.keys or not plan.columns:
            raise ValueError(f"{plan.where}: a lookup needs key and looked-up columns")
        for field, _ in plan.keys:
            if input_schema.get_field_index(field) < 0:
                raise ValueError(f"{plan.where}: key field {field} is not in the input")
        if batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, got {batch_size}")
        if latency < 0:
            raise ValueError("latency must not be negative")
        super().__init__(dsn, pool_size, where, patience)
        self._plan = plan
        self._input_schema = input_schema
        self._column_types = dict(column_types)
        self._batch_size, self._query_timeout, self._latency = batch_size, query_timeout, latency
        self._clock = clock
        self._cache: BatchCache | None = None  # the partial cache, built by open()
        self._guard = HitRateGuard(plan.cache_min_hit_rate if plan.cache == "partial" else 0.0)
        self._shape: LookupShape | None = None
        self._shape_values: tuple[ValueColumn, ...] = ()
        self._nothing: Found | None = None  # no rows (typed), built by open()
        self._joiner: Joiner | None = None
        self._table: Found | None = None  # the full cache: replaced whole, never mutated
        self._reloader: Reloader | None = None
        self._tasks: set[asyncio.Task[None]] = set()  # asyncio keeps only weak references
        self.reloads = 0

    @property
    def cache(self) -> BatchCache | None:
        """The partial cache (None without one, and before ``open()``)."""
        return self._cache

    @property
    def reload_failures(self) -> int:
        return 0 if self._reloader is None else self._reloader.failures

    # -- lifecycle (event loop) ----------------------------------------------------------

    async def open(self) -> None:
        """Join the pool, check the step against the catalog and build the statements;
        with the full cache, load the table and start its periodic reload."""
        await super().open()
        if self._plan.cache != "full":
            return
        try:
            await self.reload()
        except BaseException:
            await self._leave_pool()
            raise
        if self._plan.reload_every:
            self._reloader = Reloader(self._plan.reload_every, self.reload, self._plan.qualified)
            self._reloader.start()

    async def close(self) -> None:
        if self._reloader is not None:
            await self._reloader.stop()
        # Batches still running belong to a failing task: their results would be dropped.
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        self._table = None
        await self._leave_pool()

    async def reload(self) -> None:
        """Load the whole table into the full cache, then swap it in (one assignment: a
        batch sees the old table or the new one, never a mix)."""
        pool, shape = self._pool, self._shape
        if pool is None or shape is None:
            raise RuntimeError("BatchLookup.reload() before open() or after close()")
        found = await load_table(
            pool, shape, chunk_rows=LOAD_CHUNK_ROWS, timeout=self._query_timeout
        )
        self.rows_fetched += len(found)
        self._table = found
        self.reloads += 1

    async def _build_sql(self, conn: asyncpg.Connection) -> str:
        plan = self._plan
        shape = await read_shape(conn, plan, self._input_schema, self._column_types)
        added = [pa.field(v.output, v.type) for v in shape.values]
        self._joiner = Joiner(
            self._input_schema, added, [k.field for k in shape.keys], plan.on_miss, plan.qualified
        )
        self._shape, self._shape_values = shape, shape.values
        if plan.cache == "partial" and self._cache is None:
            self._cache = BatchCache(
                plan.cache_rows,
                [v.type for v in shape.values],
                expire_after_write=plan.expire_after_write,
                expire_after_access=plan.expire_after_access,
                # A cached miss would answer every retry: never cache misses when retrying.
                cache_missing_key=plan.cache_missing and plan.retry_attempts == 0,
                clock=self._clock,
            )
        self._nothing = to_found(shape, [None] * (len(shape.keys) + len(shape.values)))
        return shape.query

    # -- requests (mailbox thread) -------------------------------------------------------

    def async_invoke(self, value: Batch, result_future: ResultFuture[Batch]) -> None:
        start = perf_counter()
        try:
            shape = self._shape
            if shape is None or self._pool is None:
                raise RuntimeError("BatchLookup used before open() or after close()")
            keys = join_keys(
                value.rows, [k.field for k in shape.keys], [k.join_type for k in shape.keys]
            )
            table = self._table  # read once: one version of the full cache serves the batch
            if table is not None:
                out, unmatched = self._join(value, keys, table)
                self.cache_hits += value.rows.num_rows - unmatched
                self.cache_misses += unmatched
                self._complete(out, value, result_future, start)
                return
            answer, counted = self._cached(keys)
            if answer is None:  # no cache, or bypassed: the distinct keys are queried
                missing = _as_parts(keys, counted) or distinct_keys(keys)
                if not len(missing[0]):
                    assert self._nothing is not None
                    out = self._join(value, keys, self._nothing)[0]
                    self._complete(out, value, result_future, start)
                    return
            elif answer.absent is None:
                self._complete(
                    self._answered(value, keys, answer, None), value, result_future, start
                )
                return
            else:
                missing = _as_parts(keys, answer.missing) or distinct_keys(
                    [k.filter(answer.absent) for k in keys]
                )
        except Exception as exc:
            result_future.complete_exceptionally(exc)
            return
        task = asyncio.get_running_loop().create_task(
            self._serve(value, keys, answer, missing, result_future, start)
        )
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _join(self, batch: Batch, keys: list[pa.Array], found: Found) -> tuple[Batch, int]:
        """The output of ``batch`` and its number of unmatched rows."""
        assert self._joiner is not None
        positions = match(keys, found.keys)
        return self._joiner.join(batch, keys, positions, found), positions.null_count

    def _complete(
        self, out: Batch, batch: Batch, future: ResultFuture[Batch], start: float
    ) -> None:
        rows = batch.rows.num_rows
        self.lookups += rows
        self._latencies.record_weighted(perf_counter() - start, rows)
        future.complete([out])

    # -- the partial cache (mailbox thread) ----------------------------------------------

    def _cached(self, keys: list[pa.Array]) -> tuple[Answer | None, pa.Array | None]:
        """The partial cache's answer for the batch's ``keys`` (each row's key parts), or
        None without a cache or when the guard bypasses it; with a bypass, also the distinct
        cache keys (no null) the guard counted, which the query can reuse (``_as_parts``)."""
        cache = self._cache
        if cache is None:
            return None, None
        coded = cache_keys(keys)
        distinct = pc.unique(coded)
        count = len(distinct) - distinct.null_count
        if not self._guard.consult(count):
            self.cache_bypassed += count
            return None, distinct.drop_null()
        hits, misses = cache.hits, cache.misses
        answer = cache.lookup(coded, count)
        answered = cache.hits - hits
        self._guard.record(answered, count, cache)
        self.cache_hits += answered
        self.cache_misses += cache.misses - misses
        return answer, None

    def _answered(
        self, batch: Batch, keys: list[pa.Array], answer: Answer, found: Found | None
    ) -> Batch:
        """The output of ``batch`` from the cache's ``answer`` and the rows ``found`` for
        the keys it did not hold."""
        assert self._joiner is not None
        rows, added = answer.rows(keys, found)
        return self._joiner.join_added(batch, keys, rows, added)

    def _remember(self, answer: Answer, missing: list[pa.Array], found: Found) -> None:
        """Cache the rows found for the ``missing`` keys of ``answer``, and those without a
        row as misses."""
        assert self._cache is not None
        self._cache.store(cache_keys(missing), cache_keys(found.keys), found.values, answer=answer)

    # -- queries (a task on the event loop) -----------------------------------------------

    async def _serve(
        self,
        batch: Batch,
        keys: list[pa.Array],
        answer: Answer | None,
        missing: list[pa.Array],
        future: ResultFuture[Batch],
        start: float,
    ) -> None:
        try:
            step, count = self._batch_size, len(missing[0])
            if count <= step:  # one query: awaited as is (gather would wrap it in a task)
                found = await self._query(missing)
            else:
                found = Found.concat(
                    await asyncio.gather(
                        *(
                            self._query([k.slice(i, step) for k in missing])
                            for i in range(0, count, step)
                        )
                    )
                )
            if answer is None:
                out = self._join(batch, keys, found)[0]
            else:
                self._remember(answer, missing, found)
                out = self._answered(batch, keys, answer, found)
        except BaseException as exc:  # handed to the operator (retry, or fail the task)
            future.complete_exceptionally(exc)
            if isinstance(exc, asyncio.CancelledError):
                raise
            return
        self._complete(out, batch, future, start)

    async def _query(self, keys: list[pa.Array]) -> Found:
        pool, sql, shape = self._pool, self._sql, self._shape
        if pool is None or sql is None or shape is None:
            raise RuntimeError("BatchLookup used before open() or after close()")
        args = [_bound(part, array) for part, array in zip(shape.keys, keys, strict=True)]
        self.batches += 1
        self.keys_queried += len(keys[0])
        conn = pool.try_acquire() or await pool.acquire()
        try:
            statement = pool.cached(conn, sql) or await pool.prepared(
                conn, sql, self._query_timeout
            )
            if self._latency:
                await asyncio.sleep(self._latency)
            row = await statement.fetchrow(*args, timeout=self._query_timeout)
        except BaseException:
            pool.discard(conn)
            raise
        pool.release(conn)
        assert row is not None  # an aggregate without GROUP BY returns one row
        found = to_found(shape, list(row))
        self.rows_fetched += len(found)
        return found


def _as_parts(keys: list[pa.Array], coded: pa.Array | None) -> list[pa.Array] | None:
    """Distinct cache keys ``coded`` (no null) as the key parts to query, when the cache
    keys are the keys themselves (one part, not recoded: ``cache_keys``); else None (the
    caller finds the distinct parts)."""
    if coded is not None and len(keys) == 1 and coded.type == keys[0].type:
        return [coded]
    return None


def _bound(part: KeyPart, keys: pa.Array) -> list[Any]:
    """Join-typed ``keys`` as asyncpg binds them (timestamps: datetimes of the column's kind)."""
    values: list[Any] = (keys if part.bind_type is None else keys.cast(part.bind_type)).to_pylist()
    return values
