"""Sinks: two-phase-commit output (staged per checkpoint, committed with it)."""

from spark_jobs.sink._parquet import (
    ENRICHED_SCHEMA,
    SINK_NAME,
    ParquetSink,
    ParquetSinkWriter,
    StagedOutput,
    publish_files,
)

__all__ = [
    "ENRICHED_SCHEMA",
    "SINK_NAME",
    "ParquetSink",
    "ParquetSinkWriter",
    "StagedOutput",
    "publish_files",
]
