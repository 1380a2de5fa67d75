"""Sinks: two-phase-commit output (staged per checkpoint, committed with it), for any output
schema a pipeline derives."""

from spark_jobs.sink._batch_tables import batch_tables, staged_rows
from spark_jobs.sink._folders import replace_folder
from spark_jobs.sink._parquet import (
    SINK_NAME,
    ParquetSink,
    ParquetSinkWriter,
    StagedFileError,
    publish_files,
)
from spark_jobs.sink._postgres_table import PostgresTableSinkWriter
from spark_jobs.sink._rebuild_swap import finish_rebuilds
from spark_jobs.sink._staged import StagedOutput
from spark_jobs.sink._table_commit import PostgresTableSink
from spark_jobs.sink._table_layout import TABLE_SINK_NAME
from spark_jobs.sink._table_lock import table_lock
from spark_jobs.sink._table_setup import ensure_tables, sweep_staged
from spark_jobs.sink._writers import (
    SINKS,
    SinkWriter,
    build_sinks,
    committer,
    open_sink_writer,
)

__all__ = [
    "SINKS",
    "SINK_NAME",
    "TABLE_SINK_NAME",
    "ParquetSink",
    "ParquetSinkWriter",
    "PostgresTableSink",
    "PostgresTableSinkWriter",
    "SinkWriter",
    "StagedFileError",
    "StagedOutput",
    "batch_tables",
    "build_sinks",
    "committer",
    "ensure_tables",
    "finish_rebuilds",
    "open_sink_writer",
    "publish_files",
    "replace_folder",
    "staged_rows",
    "sweep_staged",
    "table_lock",
]
