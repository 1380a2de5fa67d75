"""Sinks by name: the task side's writer and the commit sides (``sink_transactions.sink``),
from the registered sink connectors (:mod:`spark_jobs.connectors`)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from os import PathLike
from typing import Any

import pyarrow as pa
from sqlalchemy.engine import Engine

from enumerator_service import Location, StorageOptions, TransactionalSink
from spark_jobs.connectors._interface import SinkWriterContext
from spark_jobs.connectors._registry import registered_sinks, sink_connector_named
from spark_jobs.pipeline._plan import SinkPlan

__all__ = ["SINKS", "SinkWriter", "build_sinks", "committer", "open_sink_writer"]

#: A task-side writer (``write``, ``snapshot``, ``restore``, ``close``) of some connector.
SinkWriter = Any


def build_sinks(
    engine: Engine | None, storage: StorageOptions | None = None
) -> dict[str, TransactionalSink]:
    """The commit side of every registered sink (recovery needs them all), by
    ``sink_transactions.sink`` name; ``engine``: for aborts that clean up at once;
    ``storage``: how object stores are reached (``StorageOptions.of(settings)``)."""
    sinks: dict[str, TransactionalSink] = {}
    for connector in {id(c): c for c in registered_sinks().values()}.values():
        sinks.update(connector.committers(engine, storage))
    return sinks


class _RegisteredCommitters(Mapping[str, TransactionalSink]):
    """The commit sides of every registered sink, looked up when used (a connector may be
    registered after this module is imported), without an engine: a table sink's abort()
    then leaves staged rows to sweep_staged."""

    def __getitem__(self, name: str) -> TransactionalSink:
        return build_sinks(None)[name]

    def __iter__(self) -> Iterator[str]:
        return iter(build_sinks(None))

    def __len__(self) -> int:
        return len(build_sinks(None))


SINKS: Mapping[str, TransactionalSink] = _RegisteredCommitters()


def committer(sink: str) -> TransactionalSink:
    """The commit side of sink ``sink`` (AT_LEAST_ONCE acknowledgements: ``commit`` receives
    the connection, so no engine is needed)."""
    return build_sinks(None)[sink]


def open_sink_writer(
    plan: SinkPlan,
    io: ThreadPoolExecutor,
    *,
    schema: pa.Schema,
    partitioned: bool,
    dsn: str,
    staging_root: Location | str | PathLike[str] | None,
    output_root: Location | str | PathLike[str] | None,
    run_id: str,
    subtask: int,
    attempt: str,
) -> SinkWriter:
    """The task-side writer of ``plan`` for output batches of ``schema`` (the pipeline's
    resolved output schema); file or database I/O runs on ``io``.

    ``partitioned``: the source is day-partitioned (a table sink then has the ``dt``
    column). ``dsn``: the database (table sinks). ``output_root``: a file sink's table
    folder; ``staging_root``: where its files are staged, outside that folder.
    """
    context = SinkWriterContext(
        schema, partitioned, dsn, run_id, subtask, attempt, staging_root, output_root
    )
    return sink_connector_named(plan.kind).open_writer(plan, io, context)
