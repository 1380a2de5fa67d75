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
from spark_jobs.sink._rebuild_swap import finish_rebuilds
from spark_jobs.sink._writers import (
    SINKS,
    SinkWriter,
    build_sinks,
    committer,
    open_sink_writer,
)

__all__ = [
    "ENRICHED_SCHEMA",
    "SINKS",
    "SINK_NAME",
    "TABLE_SINK_NAME",
    "ParquetSink",
    "ParquetSinkWriter",
    "PostgresTableSink",
    "PostgresTableSinkWriter",
    "SinkWriter",
    "StagedOutput",
    "build_sinks",
    "committer",
    "ensure_tables",
    "finish_rebuilds",
    "open_sink_writer",
    "publish_files",
    "sweep_staged",
]
