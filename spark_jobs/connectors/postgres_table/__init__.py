"""Postgres table: a table's rows in ranges of its integer key — the ``TableSource``."""

from spark_jobs.connectors._registry import register_source
from spark_jobs.connectors.postgres_table._connector import TableConnector, TableOptions
from spark_jobs.connectors.postgres_table._spec import TableSource

__all__ = ["TableConnector", "TableOptions", "TableSource"]

register_source(TableSource, TableConnector())
