"""Sinks: two-phase-commit output (staged per checkpoint, committed with it)."""

from spark_jobs.sink._parquet import (
    ENRICHED_SCHEMA,
    SINK_NAME,
    ParquetSink,
    ParquetSinkWriter,
    StagedOutput,
    publish_files,
)
from spark_jobs.sink._postgres_table import (
    TABLE_SINK_NAME,
    PostgresTableSink,
    PostgresTableSinkWriter,
    ensure_tables,
    sweep_staged,
)

__all__ = [
    "ENRICHED_SCHEMA",
    "SINK_NAME",
    "TABLE_SINK_NAME",
    "ParquetSink",
    "ParquetSinkWriter",
    "PostgresTableSink",
    "PostgresTableSinkWriter",
    "StagedOutput",
    "ensure_tables",
    "publish_files",
    "sweep_staged",
]
