"""Lookup functions for the async I/O operator."""

from spark_jobs.lookup._postgres import PostgresLookup, acquire_pool, release_pool

__all__ = ["PostgresLookup", "acquire_pool", "release_pool"]
