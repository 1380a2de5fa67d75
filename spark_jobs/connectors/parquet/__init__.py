"""Parquet: files in a table folder, committed with the checkpoint — the ``ParquetSink``."""

from spark_jobs.connectors._registry import register_sink
from spark_jobs.connectors.parquet._connector import (
    ParquetConnector,
    ParquetOptions,
    parquet_files,
    partition_folder,
)
from spark_jobs.connectors.parquet._spec import ParquetSink

__all__ = ["ParquetConnector", "ParquetOptions", "ParquetSink", "parquet_files", "partition_folder"]

register_sink(ParquetSink, ParquetConnector())
