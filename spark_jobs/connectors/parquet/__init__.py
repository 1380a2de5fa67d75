"""Parquet: files in a table folder, committed with the checkpoint — the ``ParquetSink``."""

from spark_jobs.connectors._registry import register_sink
from spark_jobs.connectors.parquet._connector import (
    ParquetConnector,
    ParquetOptions,
    parquet_files,
    parquet_objects,
    partition_folder,
)
from spark_jobs.connectors.parquet._paths import (
    STAGING_FOLDER,
    output_path,
    output_root,
    staging_of,
    staging_path,
    staging_root,
)
from spark_jobs.connectors.parquet._spec import ParquetSink

__all__ = [
    "STAGING_FOLDER",
    "ParquetConnector",
    "ParquetOptions",
    "ParquetSink",
    "output_path",
    "output_root",
    "parquet_files",
    "parquet_objects",
    "partition_folder",
    "staging_of",
    "staging_path",
    "staging_root",
]

register_sink(ParquetSink, ParquetConnector())
