"""Sinks by name: the task side's writer and the commit sides (``sink_transactions.sink``)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from sqlalchemy.engine import Engine

from enumerator_service import TransactionalSink
from spark_jobs.sink._parquet import SINK_NAME, ParquetSink, ParquetSinkWriter
from spark_jobs.sink._postgres_table import (
    TABLE_SINK_NAME,
    PostgresTableSink,
    PostgresTableSinkWriter,
)

__all__ = ["SINKS", "SinkWriter", "build_sinks", "committer", "open_sink_writer"]

SinkWriter = ParquetSinkWriter | PostgresTableSinkWriter

#: The commit side of every sink kind that may have staged output (recovery needs them all).
#: Without an engine the table sink's abort() leaves staged rows to sweep_staged (the driver
#: itself uses build_sinks(engine), whose table sink deletes them at once).
SINKS: dict[str, TransactionalSink] = {
    SINK_NAME: ParquetSink(),
    TABLE_SINK_NAME: PostgresTableSink(),
}


def build_sinks(engine: Engine) -> dict[str, TransactionalSink]:
    """SINKS with a table sink that aborts through ``engine``."""
    return {**SINKS, TABLE_SINK_NAME: PostgresTableSink(engine)}


def committer(sink: str) -> TransactionalSink:
    """The commit side of sink ``sink`` (AT_LEAST_ONCE acknowledgements: ``commit`` receives
    the connection, so no engine is needed)."""
    return SINKS[sink]


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
