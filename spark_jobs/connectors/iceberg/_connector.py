"""The Iceberg sink connector (``IcebergSink``): Parquet data files staged per checkpoint
under the table's data folder (``_writer``), one snapshot per completed checkpoint
(``_commit``), a rebuilt day replaced in one overwrite snapshot (``_rebuild``), the table
created and evolved before the tasks start (``_table``) in Sluice's catalog or a named
PyIceberg catalog (``_catalog``).

Row accounting for the Dagster checks: committed rows from the committed transactions'
entries, rows present from the current snapshot's data files (manifest record counts).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import date
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc
import sqlalchemy as sa
from pyiceberg.exceptions import NoSuchTableError
from pyiceberg.table import Table
from sqlalchemy.engine import Engine

from enumerator_service import ConfigError, Location, Settings, StorageOptions, TransactionalSink
from spark_jobs.connectors._committed_rows import DayFiles, committed_day_rows
from spark_jobs.connectors._interface import SinkConnector, SinkDetails, SinkWriterContext
from spark_jobs.connectors._upsert_key import (
    UPSERT_KEY_PROPERTY,
    check_recorded_key,
    recorded_value,
)
from spark_jobs.connectors.iceberg._catalog import (
    catalog_engine,
    data_root,
    default_warehouse,
    ensure_namespace,
    location_of,
    lock_name,
    open_catalog,
    planned_location,
)
from spark_jobs.connectors.iceberg._commit import SINK_NAME, IcebergCommitter
from spark_jobs.connectors.iceberg._maintenance import IcebergMaintenance
from spark_jobs.connectors.iceberg._metadata import table_metadata
from spark_jobs.connectors.iceberg._rebuild import day_files, day_filter, finish_iceberg_rebuilds
from spark_jobs.connectors.iceberg._table import ensure_table, expected_partition
from spark_jobs.connectors.iceberg._writer import IcebergSinkWriter
from spark_jobs.pipeline._checks import parquet_compression, upsert_key
from spark_jobs.pipeline._errors import check_identifier
from spark_jobs.sink._object_store import check_reachable

if TYPE_CHECKING:
    from enumerator_service import Rebuild
    from spark_jobs.pipeline._checks import Context
    from spark_jobs.pipeline._definition import Pipeline
    from spark_jobs.pipeline._plan import Column, Plan, SinkPlan

__all__ = ["IcebergConnector", "IcebergOptions"]

_SAMPLE_KEYS = 5
#: The Iceberg sink's files of a day (under ``…/dt=D/``) and of its rebuild ``l.id``.
_DAY_FILES = DayFiles(
    live="strpos(files.final, '/dt=' || w.day || '/') > 0"
    " AND strpos(files.final, '/_rebuilds/') = 0",
    rebuilt="strpos(files.final, '/_rebuilds/dt=' || w.day || '/' || l.id || '/') > 0",
)


@dataclass(frozen=True, slots=True)
class IcebergOptions:
    """The table (``namespace.name``), the catalog (None: Sluice's), the partitioning asked
    for (``auto``, a field, None) and the Parquet codec."""

    table: str
    catalog: str | None
    partition_by: str | None
    compression: str = "zstd"


def _table_name(given: object, what: str = "table") -> str:
    if not isinstance(given, str) or given.count(".") != 1:
        raise ValueError(f"{what} must be 'namespace.name', got {given!r}")
    namespace, name = given.split(".")
    check_identifier(namespace, "namespace")
    check_identifier(name, "table name")
    return given


class IcebergConnector(SinkConnector):
    """The Iceberg sink (stateless: every method opens the catalog it needs)."""

    name = SINK_NAME

    def validate(
        self, spec: Any, ctx: Context, *, pipeline: str, columns: tuple[Column, ...], is_open: bool
    ) -> SinkDetails:
        table = ctx.check(_table_name, spec.table, "table")
        if spec.catalog is not None and (not isinstance(spec.catalog, str) or not spec.catalog):
            raise ctx.fail("catalog must be a PyIceberg catalog name (or None: Sluice's)")
        if spec.partition_by is not None and not isinstance(spec.partition_by, str):
            raise ctx.fail("partition_by must be 'auto', the event-time field, or None")
        parquet_compression(ctx, spec.compression)
        upsert = upsert_key(ctx, spec.upsert_key, columns, is_open)
        options = IcebergOptions(table, spec.catalog, spec.partition_by, spec.compression)
        return SinkDetails(options, upsert)

    def describe(self, plan: Plan) -> str:
        options: IcebergOptions = plan.sink.options
        where = f"iceberg {options.catalog or 'sluice'}.{options.table}"
        upsert = plan.sink.upsert_key
        return where + (f", upsert on {', '.join(upsert)}" if upsert else ", append")

    def check_plan(self, plan: Plan, ctx: Context) -> None:
        options: IcebergOptions = plan.sink.options
        # (Unresolved outputs: the source's columns pass through, so check against them.)
        outputs = [c.name for c in (plan.outputs if plan.complete else plan.source.columns)]
        try:
            expected_partition(plan.name, plan.source, outputs, options.partition_by)
        except ConfigError as exc:
            raise ctx.fail(f"IcebergSink(partition_by): {exc.problem}") from None

    def _open(self, engine: Engine, pipeline: Pipeline, settings: Settings) -> Any:
        options: IcebergOptions = pipeline.plan.sink.options
        warehouse = None if options.catalog else default_warehouse(settings)
        return open_catalog(
            engine,
            options.catalog,
            StorageOptions.of(settings),
            warehouse,
            what=f"pipeline {pipeline.name}: IcebergSink(catalog)",
        )

    def _table(self, pipeline: Pipeline, settings: Settings) -> Table | None:
        engine = catalog_engine(settings)
        try:
            try:
                table: Table = self._open(engine, pipeline, settings).load_table(
                    pipeline.plan.sink.options.table
                )
                return table
            except NoSuchTableError:
                return None
        finally:
            engine.dispose()

    def location(self, pipeline: Pipeline, settings: Settings, days: Sequence[date]) -> str:
        options: IcebergOptions = pipeline.plan.sink.options
        table = self._table(pipeline, settings)
        where = f"iceberg {options.catalog or 'sluice'}.{options.table}"
        return where if table is None else f"{where} ({table.location()})"

    def output_root(self, pipeline: Pipeline, settings: Settings) -> Location | None:
        # The table's data folder: the tasks write their data files straight into it.
        options: IcebergOptions = pipeline.plan.sink.options
        storage = StorageOptions.of(settings)
        table = self._table(pipeline, settings)
        if table is not None:
            return data_root(table, storage)
        engine = catalog_engine(settings)
        try:
            namespace, name = options.table.split(".")
            planned = planned_location(self._open(engine, pipeline, settings), namespace, name)
        finally:
            engine.dispose()
        if planned is None:
            raise ConfigError(
                f"pipeline {pipeline.name}: IcebergSink(table)",
                f"{options.table} does not exist and catalog {options.catalog!r} chooses table "
                "locations itself: create the table first",
            )
        return location_of(f"{planned}/data", storage)

    def check_output(self, pipeline: Pipeline, settings: Settings) -> None:
        options: IcebergOptions = pipeline.plan.sink.options
        if settings.checkpointing_mode != "EXACTLY_ONCE":
            raise ConfigError(
                "SLUICE_CHECKPOINTING_MODE",
                f"pipeline {pipeline.name}: the Iceberg sink commits one snapshot per "
                "completed checkpoint (EXACTLY_ONCE only)",
            )
        outputs = [c.name for c in pipeline.plan.outputs]
        expected_partition(pipeline.name, pipeline.plan.source, outputs, options.partition_by)
        root = self.output_root(pipeline, settings)
        assert root is not None
        check_reachable(
            root,
            "SLUICE_WAREHOUSE_DIR"
            if options.catalog is None
            else f"pipeline {pipeline.name}: IcebergSink(table) location",
        )
        if not root.object_store:
            _check_writable(root.path)
        engine = catalog_engine(settings)
        try:
            warehouse = None if options.catalog else default_warehouse(settings)
            ensure_namespace(
                self._open(engine, pipeline, settings), options.table.split(".")[0], warehouse
            )
        finally:
            engine.dispose()

    def committers(
        self, engine: Engine | None, storage: StorageOptions | None = None
    ) -> Mapping[str, TransactionalSink]:
        return {SINK_NAME: IcebergCommitter(engine, storage)}

    def prepare(self, engine: Engine, plan: Plan, pipeline: Pipeline, settings: Settings) -> None:
        options: IcebergOptions = plan.sink.options
        schema = plan.output_schema()
        partition = expected_partition(
            pipeline.name, plan.source, schema.names, options.partition_by
        )
        catalog = self._open(engine, pipeline, settings)
        what = f"pipeline {pipeline.name}: IcebergSink"
        table = ensure_table(
            catalog,
            options.table,
            schema,
            partition,
            what=what,
            storage=StorageOptions.of(settings),
        )
        key = plan.sink.upsert_key
        recorded = table.properties.get(UPSERT_KEY_PROPERTY)
        if check_recorded_key(recorded, key, options.table, what):
            with table.transaction() as tx:
                tx.set_properties({UPSERT_KEY_PROPERTY: recorded_value(key)})

    def open_writer(
        self, plan: SinkPlan, io: ThreadPoolExecutor, context: SinkWriterContext
    ) -> IcebergSinkWriter:
        options: IcebergOptions = plan.options
        return IcebergSinkWriter(
            io,
            schema=context.schema,
            compression=options.compression,
            data=context.output_root,
            table=options.table,
            catalog=options.catalog,
            upsert_key=plan.upsert_key,
            latest_by=plan.latest_by,
            op_field=plan.op_field,
            run_id=context.run_id,
            subtask=context.subtask,
            attempt=context.attempt,
        )

    def can_replace(self, plan: SinkPlan) -> bool:
        return plan.options.partition_by is not None  # a day partition is replaced whole

    def finish_rebuilds(
        self,
        engine: Engine,
        pipeline: Pipeline,
        settings: Settings,
        sinks: Mapping[str, TransactionalSink],
    ) -> list[Rebuild]:
        options: IcebergOptions = pipeline.plan.sink.options
        source = pipeline.plan.source
        return finish_iceberg_rebuilds(
            engine,
            pipeline.name,
            sinks,
            catalog=options.catalog,
            identifier=options.table,
            field=source.event_time if source.event_day_partitions else None,
            storage=StorageOptions.of(settings),
        )

    def output_metadata(
        self, pipeline: Pipeline, settings: Settings, run_id: str | None
    ) -> dict[str, str | int]:
        options: IcebergOptions = pipeline.plan.sink.options
        return table_metadata(
            self._table(pipeline, settings), options.catalog, options.table, run_id
        )

    def maintenance(
        self, engine: Engine, pipeline: Pipeline, settings: Settings
    ) -> IcebergMaintenance | None:
        options: IcebergOptions = pipeline.plan.sink.options
        outputs = [c.name for c in pipeline.plan.outputs]
        column = expected_partition(
            pipeline.name, pipeline.plan.source, outputs, options.partition_by
        )

        def open_table() -> Table:
            table = self._table(pipeline, settings)
            if table is None:
                raise ConfigError(
                    f"pipeline {pipeline.name}: IcebergSink(table)",
                    f"{options.table} does not exist yet (no run has written it)",
                )
            return table

        lock = lock_name(options.catalog, options.table)
        return IcebergMaintenance(open_table, engine, column=column or "", lock=lock)

    def committed_rows(
        self, conn: sa.Connection, pipeline: Pipeline, settings: Settings, days: list[date]
    ) -> dict[date | None, int]:
        return committed_day_rows(
            conn, sink=SINK_NAME, source=pipeline.name, days=days, files=_DAY_FILES
        )

    def _files(self, table: Table, pipeline: Pipeline, day: date | None) -> list[Any]:
        if day is None:
            return [t.file for t in table.scan().plan_files()]
        field = pipeline.plan.source.event_time
        return [] if field is None else day_files(table, field, day)

    def rows_out(
        self,
        conn: sa.Connection,
        pipeline: Pipeline,
        settings: Settings,
        days: Sequence[date | None],
    ) -> dict[date | None, int]:
        table = self._table(pipeline, settings)
        if table is None:
            return dict.fromkeys(days, 0)
        return {day: sum(f.record_count for f in self._files(table, pipeline, day)) for day in days}

    def duplicate_keys(
        self, pipeline: Pipeline, settings: Settings, day: date | None, key: list[str]
    ) -> tuple[int, list[str]]:
        table = self._table(pipeline, settings)
        field = pipeline.plan.source.event_time
        if table is None or table.current_snapshot() is None:
            return 0, []
        scan = table.scan(selected_fields=tuple(key))
        if day is not None and field is not None:
            scan = table.scan(row_filter=day_filter(field, day), selected_fields=tuple(key))
        rows: pa.Table = scan.to_arrow()
        counts = rows.group_by(key).aggregate([([], "count_all")])
        repeated = counts.filter(pc.greater(counts.column("count_all"), 1))
        sample = repeated.select(key).slice(0, _SAMPLE_KEYS).to_pylist()
        return rows.num_rows - counts.num_rows, [str(tuple(row.values())) for row in sample]


def _check_writable(path: str) -> None:
    """A local data folder (or its nearest existing parent) the driver can write into."""
    probe = path
    while not os.path.exists(probe) and os.path.dirname(probe) != probe:
        probe = os.path.dirname(probe)
    if not os.path.isdir(probe):
        raise ConfigError(
            "SLUICE_WAREHOUSE_DIR", f"{probe} is not a folder (Iceberg data folder {path})"
        )
    if not os.access(probe, os.W_OK | os.X_OK):
        raise ConfigError(
            "SLUICE_WAREHOUSE_DIR", f"{probe} is not writable (Iceberg data folder {path})"
        )
