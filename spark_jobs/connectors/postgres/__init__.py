"""Postgres: rows in a table, committed in the checkpoint's transaction — the
``PostgresSink``."""

from spark_jobs.connectors._registry import register_sink
from spark_jobs.connectors.postgres._connector import PostgresConnector, PostgresOptions
from spark_jobs.connectors.postgres._spec import PostgresSink

__all__ = ["PostgresConnector", "PostgresOptions", "PostgresSink"]

register_sink(PostgresSink, PostgresConnector())
