"""Choosing a sink by name: the task side's writer and the commit side's committer."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from enumerator_service import TransactionalSink
from spark_jobs.sink._parquet import SINK_NAME, ParquetSink, ParquetSinkWriter
from spark_jobs.sink._postgres_table import (
    TABLE_SINK_NAME,
    PostgresTableSink,
    PostgresTableSinkWriter,
)

__all__ = ["SinkWriter", "committer", "open_sink_writer"]

SinkWriter = ParquetSinkWriter | PostgresTableSinkWriter

#: Commit sides that need no engine (their ``commit`` receives the connection).
_COMMITTERS: dict[str, TransactionalSink] = {
    SINK_NAME: ParquetSink(),
    TABLE_SINK_NAME: PostgresTableSink(),
}


def committer(sink: str) -> TransactionalSink:
    """The commit side of sink ``sink`` (for AT_LEAST_ONCE acknowledgements)."""
    return _COMMITTERS[sink]


def open_sink_writer(
    sink: str,
    io: ThreadPoolExecutor,
    *,
    dsn: str,
    schema: str,
    table: str,
    staging_root: Path,
    output_root: Path,
    run_id: str,
    subtask: int,
    attempt: str,
) -> SinkWriter:
    """The task-side writer of sink ``sink`` (``parquet`` or ``postgres``); file or database
    I/O runs on ``io``."""
    if sink == TABLE_SINK_NAME:
        return PostgresTableSinkWriter(
            io,
            dsn=dsn,
            schema=schema,
            table=table,
            run_id=run_id,
            subtask=subtask,
            attempt=attempt,
        )
    return ParquetSinkWriter(
        io,
        staging_root=staging_root,
        output_root=output_root,
        run_id=run_id,
        subtask=subtask,
        attempt=attempt,
    )
