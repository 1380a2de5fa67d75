"""The Delta Lake sink connector (delta-rs): files staged in place per checkpoint, one
Delta commit per completed checkpoint (``_commit``), a rebuilt day replaced in one commit
(``_rebuild``), upserts merged by key (``_merge``).

Row accounting for the Dagster checks: committed rows from the committed transactions' file
lists in Postgres (as the Parquet sink), rows present from the add actions of the table's
current version (their ``numRecords``; no data is read), duplicates by reading the key
columns of one day.

Threading: stateless; the caller's thread (driver, CLI, Dagster).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import date
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
from deltalake import DeltaTable
from deltalake.exceptions import TableNotFoundError
from sqlalchemy.engine import Engine

from enumerator_service import (
    ConfigError,
    Location,
    Settings,
    StorageOptions,
    TransactionalSink,
)
from spark_jobs.connectors._interface import SinkConnector, SinkDetails, SinkWriterContext
from spark_jobs.connectors._table_paths import table_folder_path
from spark_jobs.connectors.delta._commit import (
    FILES,
    ROWS,
    RUN_ID,
    SINK_NAME,
    DeltaCommitter,
    append_unaligned,
)
from spark_jobs.connectors.delta._maintenance import DeltaMaintenance
from spark_jobs.connectors.delta._paths import (
    DeltaOptions,
    delta_storage,
    table_location,
    table_uri,
)
from spark_jobs.connectors.delta._rebuild import finish_delta_rebuilds
from spark_jobs.connectors.delta._rows import committed_rows, duplicate_keys, rows_out
from spark_jobs.connectors.delta._table import ensure_table, record_upsert_key, table_schema
from spark_jobs.connectors.delta._writer import DeltaSinkWriter
from spark_jobs.pipeline._checks import parquet_compression, upsert_key
from spark_jobs.pipeline._errors import check_field_name
from spark_jobs.sink._object_store import check_reachable

if TYPE_CHECKING:
    from enumerator_service import Rebuild
    from spark_jobs.pipeline._checks import Context
    from spark_jobs.pipeline._definition import Pipeline
    from spark_jobs.pipeline._plan import Column, Plan, SinkPlan

__all__ = ["DeltaConnector"]


#: Commits of the Delta log read for a run's materialisation metadata (newest first).
_HISTORY = 1000


def _table_path(given: object) -> str:
    return table_folder_path(given, "a table needs a prefix below the bucket")


def _partition(plan: Plan) -> str | None:
    """The table's partition column: ``partition_by`` for a day-partitioned pipeline."""
    options: DeltaOptions = plan.sink.options
    return options.partition_by if plan.source.partitioned else None


def _rows_written(commit: Mapping[str, Any]) -> int:
    """Rows a commit of Sluice's wrote: an append's rows, a MERGE's rows inserted or updated
    (delta-rs' metrics; its staged rows collapse to one per key, and a row of a later event
    stays)."""
    metrics = commit.get("operationMetrics") or {}
    if commit.get("operation") == "MERGE" and "num_target_rows_inserted" in metrics:
        return int(metrics["num_target_rows_inserted"]) + int(metrics["num_target_rows_updated"])
    return int(commit.get(ROWS, 0))


def _files_written(commit: Mapping[str, Any]) -> int:
    metrics = commit.get("operationMetrics") or {}
    if commit.get("operation") == "MERGE" and "num_target_files_added" in metrics:
        return int(metrics["num_target_files_added"])
    return int(commit.get(FILES, 0))


class DeltaConnector(SinkConnector):
    name = SINK_NAME

    def validate(
        self,
        spec: Any,
        ctx: Context,
        *,
        pipeline: str,
        columns: tuple[Column, ...],
        is_open: bool,
    ) -> SinkDetails:
        path = ctx.check(_table_path, spec.path)
        partition = spec.partition_by
        if partition is not None:
            partition = ctx.check(check_field_name, partition, "partition_by")
        parquet_compression(ctx, spec.compression)
        upsert = upsert_key(ctx, spec.upsert_key, columns, is_open)
        return SinkDetails(DeltaOptions(path, partition, spec.compression, pipeline), upsert)

    def describe(self, plan: Plan) -> str:
        options: DeltaOptions = plan.sink.options
        partition = _partition(plan)
        layout = f", partitioned by {partition}" if partition else ""
        upsert = plan.sink.upsert_key
        mode = f", upsert on {', '.join(upsert)}" if upsert else ", append"
        return f"delta table {options.path}{layout}{mode}"

    def location(self, pipeline: Pipeline, settings: Settings, days: Sequence[date]) -> str:
        uri = table_location(pipeline, settings).uri
        partition = _partition(pipeline.plan)
        if partition and days and len(days) == 1:
            return f"{uri} ({partition}={days[0].isoformat()})"
        return uri

    def output_root(self, pipeline: Pipeline, settings: Settings) -> Location | None:
        return table_location(pipeline, settings)

    def check_output(self, pipeline: Pipeline, settings: Settings) -> None:
        what = f"pipeline {pipeline.name}: sink path"
        check_reachable(table_location(pipeline, settings), what)
        partition = _partition(pipeline.plan)
        if partition and partition in [c.name for c in pipeline.plan.outputs]:
            raise ConfigError(
                f"pipeline {pipeline.name}: sink partition_by",
                f"{partition!r} is an output field (name the partition column otherwise)",
            )

    def prepare(self, engine: Engine, plan: Plan, pipeline: Pipeline, settings: Settings) -> None:
        location = table_location(pipeline, settings)
        partition = _partition(plan)
        schema = table_schema(plan.output_schema(), partition)
        what = f"pipeline {pipeline.name}: sink {location.uri}"
        ensure_table(table_uri(location), delta_storage(location), schema, partition, what)
        record_upsert_key(table_uri(location), delta_storage(location), plan.sink.upsert_key, what)

    def committers(
        self, engine: Engine | None, storage: StorageOptions | None = None
    ) -> Mapping[str, TransactionalSink]:
        return {SINK_NAME: DeltaCommitter(engine, storage)}

    def open_writer(
        self, plan: SinkPlan, io: ThreadPoolExecutor, context: SinkWriterContext
    ) -> DeltaSinkWriter:
        options: DeltaOptions = plan.options
        table: Location = context.output_root
        meta = {
            "table": table_uri(table),
            "pipeline": options.pipeline,
            "partition": options.partition_by if context.partitioned else None,
            "upsert_key": list(plan.upsert_key) if plan.upsert_key else None,
            "latest_by": plan.latest_by,
            "op_field": plan.op_field,
        }
        return DeltaSinkWriter(
            io,
            schema=context.schema,
            compression=options.compression,
            table=table,
            meta=meta,
            run_id=context.run_id,
            subtask=context.subtask,
            attempt=context.attempt,
        )

    def publish_unaligned(self, staged: list[Any], storage: StorageOptions) -> None:
        append_unaligned(staged, storage)

    def can_replace(self, plan: SinkPlan) -> bool:
        # A day is replaced in one overwrite commit of its partition (upsert: rows by key);
        # a table without the partition column has no day to replace.
        options: DeltaOptions = plan.options
        return bool(plan.upsert_key) or options.partition_by is not None

    def finish_rebuilds(
        self,
        engine: Engine,
        pipeline: Pipeline,
        settings: Settings,
        sinks: Mapping[str, TransactionalSink],
    ) -> list[Rebuild]:
        if pipeline.plan.sink.upsert_key:
            return super().finish_rebuilds(engine, pipeline, settings, sinks)
        location = table_location(pipeline, settings)
        return finish_delta_rebuilds(
            engine,
            source=pipeline.name,
            uri=table_uri(location),
            storage=delta_storage(location),
            partition=_partition(pipeline.plan),
            sinks=sinks,
        )

    def output_metadata(
        self, pipeline: Pipeline, settings: Settings, run_id: str | None
    ) -> dict[str, str | int]:
        location = table_location(pipeline, settings)
        found: dict[str, str | int] = {
            "dagster/uri": location.uri,
            "dagster/table_name": location.uri.rstrip("/").rsplit("/", 1)[-1],
        }
        try:
            table = DeltaTable(table_uri(location), storage_options=delta_storage(location))
        except TableNotFoundError:
            return found  # (no run has written it yet)
        found["delta_version"] = table.version()
        if run_id is not None:
            mine = [c for c in table.history(_HISTORY) if c.get(RUN_ID) == run_id]
            found["rows_added"] = sum(_rows_written(c) for c in mine)
            found["files_added"] = sum(_files_written(c) for c in mine)
            found["commits_added"] = len(mine)
        return found

    def maintenance(
        self, engine: Engine, pipeline: Pipeline, settings: Settings
    ) -> DeltaMaintenance | None:
        location = table_location(pipeline, settings)
        column = _partition(pipeline.plan) or "dt"
        return DeltaMaintenance(table_uri(location), delta_storage(location), engine, column=column)

    def committed_rows(
        self, conn: sa.Connection, pipeline: Pipeline, settings: Settings, days: list[date]
    ) -> dict[date | None, int]:
        return committed_rows(conn, pipeline.name, table_location(pipeline, settings), days)

    def rows_out(
        self,
        conn: sa.Connection,
        pipeline: Pipeline,
        settings: Settings,
        days: Sequence[date | None],
    ) -> dict[date | None, int]:
        location = table_location(pipeline, settings)
        return rows_out(location, _partition(pipeline.plan), days)

    def duplicate_keys(
        self, pipeline: Pipeline, settings: Settings, day: date | None, key: list[str]
    ) -> tuple[int, list[str]]:
        location = table_location(pipeline, settings)
        return duplicate_keys(location, _partition(pipeline.plan), day, key)
