"""What every Postgres lookup function shares: its pool, its SQL, its counters."""

from __future__ import annotations

import abc
from collections.abc import Sequence
from typing import Generic, TypeVar

import asyncpg

from enumerator_service import ConfigError, qualified_name
from spark_jobs.async_io import AsyncFunction
from spark_jobs.lookup._connections import (
    CONNECT_PATIENCE,
    ConnectionPool,
    acquire_pool,
    release_pool,
)
from spark_jobs.lookup._metrics import LatencyHistogram, LookupMetrics

__all__ = ["PooledLookup", "column_types"]

IN = TypeVar("IN")
OUT = TypeVar("OUT")

# The columns' types without typmod: casting keys to e.g. varchar(20) would silently truncate
# a longer key and match the wrong row.
_COLUMN_TYPES = """
SELECT attname, format_type(atttypid, NULL)
FROM pg_catalog.pg_attribute
WHERE attrelid = $1 AND attnum > 0 AND NOT attisdropped
"""


async def column_types(
    conn: asyncpg.Connection,
    schema: str,
    table: str,
    key_columns: Sequence[str],
    columns: Sequence[str],
) -> dict[str, str]:
    """The SQL types of table ``schema.table``'s columns, from the catalog; a ConfigError
    naming the setting when the table or one of the key or looked-up columns does not exist."""
    qualified = f"{schema}.{table}"
    oid = await conn.fetchval("SELECT to_regclass($1)::oid", qualified_name(schema, table))
    if oid is None:
        raise ConfigError("table", f"lookup table {qualified} does not exist")
    types: dict[str, str] = dict(await conn.fetch(_COLUMN_TYPES, oid))
    for setting, names in (("key_column", key_columns), ("columns", columns)):
        for name in names:
            if name not in types:
                raise ConfigError(setting, f"lookup table {qualified} has no column {name}")
    return types


class PooledLookup(AsyncFunction[IN, OUT], Generic[IN, OUT]):
    """A lookup on the worker's shared asyncpg pool for ``dsn`` (``pool_size`` connections;
    one pool per process, event loop and dsn: asyncpg pools belong to the loop that created
    them),
    with the lookup counters and latency histogram behind :meth:`metrics`.

    Threading: everything runs on the event loop of the task's mailbox thread; the counters
    are plain attributes because only that thread touches them (the per-key hot path
    increments them inline).
    """

    def __init__(
        self, dsn: str, pool_size: int, where: str = "", patience: float = CONNECT_PATIENCE
    ) -> None:
        self._dsn, self._pool_size = dsn, pool_size
        self._where, self._patience = where, patience
        self._pool: ConnectionPool | None = None
        self._sql: str | None = None
        self._latencies = LatencyHistogram()
        self.lookups = 0
        self.batches = 0
        self.keys_queried = 0
        self.rows_fetched = 0
        self.cache_hits = 0
        self.cache_misses = 0
        self.cache_bypassed = 0

    async def open(self) -> None:
        """Join the worker's pool and build the statement (``_build_sql``) on one of its
        connections; leaves the pool again if that fails."""
        pool = acquire_pool(self._dsn, self._pool_size, self._where, self._patience)
        try:
            async with pool.connection() as conn:
                self._sql = await self._build_sql(conn)
        except BaseException:
            await release_pool(self._dsn)
            raise
        self._pool = pool

    async def _leave_pool(self) -> None:
        if self._pool is not None:
            self._pool = None
            await release_pool(self._dsn)

    @abc.abstractmethod
    async def _build_sql(self, conn: asyncpg.Connection) -> str:
        """The lookup statement, checked against the catalog through ``conn``."""

    def metrics(self) -> LookupMetrics:
        """A snapshot of the counters and the invoke-to-completion latency quantiles."""
        latencies = self._latencies
        return LookupMetrics(
            lookups=self.lookups,
            batches=self.batches,
            keys_queried=self.keys_queried,
            rows_fetched=self.rows_fetched,
            cache_hits=self.cache_hits,
            cache_misses=self.cache_misses,
            cache_bypassed=self.cache_bypassed,
            p50_ms=latencies.quantile(0.5) * 1e3,
            p99_ms=latencies.quantile(0.99) * 1e3,
            mean_batch_size=self.keys_queried / self.batches if self.batches else 0.0,
        )
