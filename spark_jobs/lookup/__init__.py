"""Lookup functions for the async I/O operator, with a partial cache and latency metrics."""

from spark_jobs.lookup._batch_lookup import BatchLookup, miss_retry_strategy
from spark_jobs.lookup._cache import CacheHit, LookupCache
from spark_jobs.lookup._connections import (
    CONNECT_PATIENCE,
    ConnectionPool,
    DatabaseUnreachable,
    acquire_pool,
    release_pool,
)
from spark_jobs.lookup._metrics import LatencyHistogram, LookupMetrics
from spark_jobs.lookup._postgres import PostgresLookup

__all__ = [
    "CONNECT_PATIENCE",
    "BatchLookup",
    "CacheHit",
    "ConnectionPool",
    "DatabaseUnreachable",
    "LatencyHistogram",
    "LookupCache",
    "LookupMetrics",
    "PostgresLookup",
    "acquire_pool",
    "miss_retry_strategy",
    "release_pool",
]
