"""Sinks: staged, transactional Parquet output."""

from spark_jobs.sink._parquet import (
    ENRICHED_SCHEMA,
    CommitResult,
    SplitCommitter,
    SplitOutput,
    final_path,
    publish_pending,
)

__all__ = [
    "ENRICHED_SCHEMA",
    "CommitResult",
    "SplitCommitter",
    "SplitOutput",
    "final_path",
    "publish_pending",
]
