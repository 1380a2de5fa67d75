"""Dimension lookups in Postgres over asyncpg, coalesced into ``= ANY($1)`` batches.

Concurrent lookups issued while the mailbox thread processes a slice of input are collected and
sent as one query when the event loop next runs (or as soon as ``max_batch_size`` keys are
waiting); identical keys in a batch share one row. Misses complete with ``joiner(value, None)``.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Sequence
from typing import Any, Generic, TypeVar

import asyncpg

from enumerator_service import validate_identifier
from spark_jobs.async_io import AsyncFunction, ResultFuture

__all__ = ["PostgresLookup", "acquire_pool", "release_pool"]

IN = TypeVar("IN")
OUT = TypeVar("OUT")

# One pool per (process, event loop, dsn): asyncpg pools belong to the loop that created them.
_pools: dict[tuple[int, int, str], tuple[asyncpg.Pool, int]] = {}


async def acquire_pool(dsn: str, size: int) -> asyncpg.Pool:
    key = (os.getpid(), id(asyncio.get_running_loop()), dsn)
    entry = _pools.get(key)
    if entry is None:
        pool = await asyncpg.create_pool(dsn, min_size=1, max_size=size)
        _pools[key] = (pool, 1)
        return pool
    _pools[key] = (entry[0], entry[1] + 1)
    return entry[0]


async def release_pool(dsn: str) -> None:
    key = (os.getpid(), id(asyncio.get_running_loop()), dsn)
    pool, users = _pools[key]
    if users > 1:
        _pools[key] = (pool, users - 1)
        return
    del _pools[key]
    await pool.close()


class PostgresLookup(AsyncFunction[IN, OUT], Generic[IN, OUT]):
    """Look up each input's key in ``schema.table`` and join the row (or None) onto it.

    Identifiers are validated; key values are always bound parameters.
    """

    def __init__(
        self,
        dsn: str,
        *,
        schema: str,
        table: str,
        key_column: str,
        columns: Sequence[str],
        key_of: Callable[[IN], Any],
        joiner: Callable[[IN, asyncpg.Record | None], OUT],
        max_batch_size: int = 256,
        pool_size: int = 4,
    ) -> None:
        for name, setting in ((schema, "schema"), (table, "table"), (key_column, "key_column")):
            validate_identifier(name, setting)
        for column in columns:
            validate_identifier(column, "columns")
        self._dsn = dsn
        self._sql = (
            f"SELECT {key_column}, {', '.join(columns)} FROM {schema}.{table} "
            f"WHERE {key_column} = ANY($1::bigint[])"
        )
        self._key_of = key_of
        self._joiner = joiner
        self._max_batch = max_batch_size
        self._pool_size = pool_size
        self._pool: asyncpg.Pool | None = None
        self._pending: dict[Any, list[tuple[IN, ResultFuture[OUT]]]] = {}
        self._flush_scheduled = False
        self._inflight: set[asyncio.Task[None]] = set()
        self.lookups = 0
        self.batches = 0

    async def open(self) -> None:
        self._pool = await acquire_pool(self._dsn, self._pool_size)

    async def close(self) -> None:
        if self._inflight:
            await asyncio.gather(*self._inflight, return_exceptions=True)
        if self._pool is not None:
            self._pool = None
            await release_pool(self._dsn)

    def async_invoke(self, value: IN, result_future: ResultFuture[OUT]) -> None:
        self.lookups += 1
        key = self._key_of(value)
        waiters = self._pending.get(key)
        if waiters is None:
            self._pending[key] = [(value, result_future)]
        else:
            waiters.append((value, result_future))
        if len(self._pending) >= self._max_batch:
            self._flush()
        elif not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        if not self._pending:
            return
        batch, self._pending = self._pending, {}
        task = asyncio.get_running_loop().create_task(self._query(batch))
        self._inflight.add(task)
        task.add_done_callback(self._inflight.discard)

    async def _query(self, batch: dict[Any, list[tuple[IN, ResultFuture[OUT]]]]) -> None:
        assert self._pool is not None, "PostgresLookup used before open()"
        self.batches += 1
        try:
            rows = await self._pool.fetch(self._sql, list(batch))
        except Exception as exc:
            for waiters in batch.values():
                for _, future in waiters:
                    future.complete_exceptionally(exc)
            return
        found = {row[0]: row for row in rows}
        joiner = self._joiner
        for key, waiters in batch.items():
            row = found.get(key)
            for value, future in waiters:
                future.complete([joiner(value, row)])
