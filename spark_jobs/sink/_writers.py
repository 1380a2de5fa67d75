"""Sinks by name: the task side's writer and the commit sides (``sink_transactions.sink``)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from os import PathLike

import pyarrow as pa
from sqlalchemy.engine import Engine

from enumerator_service import Location, StorageOptions, TransactionalSink
from spark_jobs.pipeline._plan import SinkPlan
from spark_jobs.sink._parquet import SINK_NAME, ParquetSink, ParquetSinkWriter
from spark_jobs.sink._postgres_table import TABLE_SINK_NAME, PostgresTableSinkWriter
from spark_jobs.sink._table_commit import PostgresTableSink

__all__ = ["SINKS", "SinkWriter", "build_sinks", "committer", "open_sink_writer"]

SinkWriter = ParquetSinkWriter | PostgresTableSinkWriter

#: The commit side of every sink kind that may have staged output (recovery needs them all).
#: Without an engine the table sink's abort() leaves staged rows to sweep_staged (the driver
#: itself uses build_sinks(engine), whose table sink deletes them at once).
SINKS: dict[str, TransactionalSink] = {
    SINK_NAME: ParquetSink(),
    TABLE_SINK_NAME: PostgresTableSink(),
}


def build_sinks(
    engine: Engine, options: StorageOptions | None = None
) -> dict[str, TransactionalSink]:
    """SINKS with a table sink that aborts through ``engine`` and a Parquet sink that opens
    object-store URIs with ``options`` (``StorageOptions.of(settings)``)."""
    return {
        **SINKS,
        SINK_NAME: ParquetSink(options),
        TABLE_SINK_NAME: PostgresTableSink(engine),
    }


def committer(sink: str) -> TransactionalSink:
    """The commit side of sink ``sink`` (AT_LEAST_ONCE acknowledgements: ``commit`` receives
    the connection, so no engine is needed)."""
    return SINKS[sink]


def open_sink_writer(
    plan: SinkPlan,
    io: ThreadPoolExecutor,
    *,
    schema: pa.Schema,
    partitioned: bool,
    dsn: str,
    staging_root: Location | str | PathLike[str],
    output_root: Location | str | PathLike[str],
    run_id: str,
    subtask: int,
    attempt: str,
) -> SinkWriter:
    """The task-side writer of ``plan`` for output batches of ``schema`` (the pipeline's
    resolved output schema); file or database I/O runs on ``io``.

    ``partitioned``: the source is day-partitioned (a table sink then has the ``dt``
    column). ``dsn``: the table sink's database. ``output_root``: the Parquet table folder
    (``<warehouse>/<plan.folder>``, a local folder or an object-store Location);
    ``staging_root``: where its files are staged, outside that folder.
    """
    if plan.kind == TABLE_SINK_NAME:
        if plan.table is None:
            raise ValueError("a postgres sink plan without a table")
        schema_name, table = plan.table
        return PostgresTableSinkWriter(
            io,
            dsn=dsn,
            schema_name=schema_name,
            table=table,
            columns=schema,
            partitioned=partitioned,
            upsert_key=plan.upsert_key,
            run_id=run_id,
            subtask=subtask,
            attempt=attempt,
        )
    return ParquetSinkWriter(
        io,
        schema=schema,
        dictionary=plan.dictionary,
        compression=plan.compression,
        staging_root=staging_root,
        output_root=output_root,
        run_id=run_id,
        subtask=subtask,
        attempt=attempt,
    )
