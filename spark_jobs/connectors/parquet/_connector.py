"""The Parquet sink connector: files staged per checkpoint, published into the table folder
when the checkpoint completes (``spark_jobs.sink._parquet``); a day is rebuilt by a
folder swap (``spark_jobs.sink._rebuild_swap``).

Row accounting for the Dagster checks reads the committed transactions' file lists and the
Parquet footers of the output (no data is read).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import date
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow.compute as pc
import pyarrow.parquet as pq
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from enumerator_service import (
    Location,
    Settings,
    StorageOptions,
    TransactionalSink,
    open_location,
)
from spark_jobs.connectors._committed_rows import DayFiles, committed_day_rows
from spark_jobs.connectors._interface import SinkConnector, SinkDetails, SinkWriterContext
from spark_jobs.connectors._table_paths import table_folder_path
from spark_jobs.connectors.parquet._paths import output_root, staging_root
from spark_jobs.pipeline._checks import names, parquet_compression, require
from spark_jobs.pipeline._errors import check_identifier
from spark_jobs.sink._object_store import check_reachable, file_paths
from spark_jobs.sink._parquet import SINK_NAME, ParquetSink, ParquetSinkWriter, publish_files
from spark_jobs.sink._rebuild_swap import finish_rebuilds

if TYPE_CHECKING:
    from enumerator_service import Rebuild
    from spark_jobs.pipeline._checks import Context
    from spark_jobs.pipeline._definition import Pipeline
    from spark_jobs.pipeline._plan import Column, Plan, SinkPlan

__all__ = [
    "ParquetConnector",
    "ParquetOptions",
    "parquet_files",
    "parquet_objects",
    "partition_folder",
]

#: Duplicated keys listed in a failed check's metadata.
_SAMPLE_KEYS = 5


@dataclass(frozen=True, slots=True)
class ParquetOptions:
    """The table folder under the warehouse, dictionary-encoded columns, compression, and
    the table folder as given (``ParquetSink.path``: a URI, an absolute folder, or one
    relative to the warehouse root), or None (``<warehouse>/<folder>``)."""

    folder: str
    dictionary: tuple[str, ...] = ()
    compression: str = "zstd"
    path: str | None = None


def _sink_path(given: object) -> str:
    return table_folder_path(
        given,
        "a table folder needs a prefix below the bucket root (its staging folder goes next to it)",
    )


def parquet_objects(folder: Location) -> list[str]:
    """The data files of one table partition folder on any file system (an object-store
    prefix too; hidden and ``_`` files are not data): paths on ``folder.fs``, e.g. for
    ``pq.read_metadata(path, filesystem=folder.fs)``."""
    return [
        path
        for path in file_paths(folder)
        if path.endswith(".parquet") and not path.rsplit("/", 1)[-1].startswith((".", "_"))
    ]


def parquet_files(folder: Path) -> list[Path]:
    """``parquet_objects`` of a local folder, as paths (none if it does not exist)."""
    return [Path(path) for path in parquet_objects(open_location(folder))]


def partition_folder(pipeline: Pipeline, settings: Settings, day: date | None) -> Location:
    """The folder of ``day``'s output (a local folder or an object-store prefix)."""
    root = output_root(pipeline, settings)
    return root if day is None else root.child(f"dt={day.isoformat()}")


#: The Parquet sink's files of a day (``<root>dt=D/``) and of its rebuild ``l.id``.
_DAY_FILES = DayFiles(
    live="starts_with(files.final, :root || 'dt=' || w.day || '/')",
    rebuilt="starts_with(files.final, :root || '_rebuilds/dt=' || w.day || '/' || l.id || '/')",
)


class ParquetConnector(SinkConnector):
    name = "parquet"

    def validate(
        self,
        spec: Any,
        ctx: Context,
        *,
        pipeline: str,
        columns: tuple[Column, ...],
        is_open: bool,
    ) -> SinkDetails:
        folder = ctx.check(check_identifier, spec.table or pipeline, "table")
        dictionary = tuple(names(ctx, spec.dictionary, "dictionary field"))
        if not is_open:
            require(ctx, dictionary, columns, "dictionary field")
        parquet_compression(ctx, spec.compression)
        path = None if spec.path is None else ctx.check(_sink_path, spec.path)
        return SinkDetails(ParquetOptions(folder, dictionary, spec.compression, path))

    def describe(self, plan: Plan) -> str:
        options: ParquetOptions = plan.sink.options
        layout = " (dt= folders)" if plan.source.partitioned else ""
        return f"parquet {options.path or options.folder}/{layout}"

    def location(self, pipeline: Pipeline, settings: Settings, days: Sequence[date]) -> str:
        folder = output_root(pipeline, settings)  # a local folder or an object-store URI
        if days and len(days) == 1:
            folder = folder.child(f"dt={days[0].isoformat()}")
        return folder.uri

    def output_root(self, pipeline: Pipeline, settings: Settings) -> Location | None:
        return output_root(pipeline, settings)

    def staging_root(self, pipeline: Pipeline, settings: Settings) -> Location | None:
        return staging_root(pipeline, settings)

    def check_output(self, pipeline: Pipeline, settings: Settings) -> None:
        options: ParquetOptions = pipeline.plan.sink.options
        setting = "SLUICE_WAREHOUSE_DIR"
        if options.path is not None:
            setting = f"pipeline {pipeline.name}: sink path"
        check_reachable(output_root(pipeline, settings), setting)

    def committers(
        self, engine: Engine | None, storage: StorageOptions | None = None
    ) -> Mapping[str, TransactionalSink]:
        return {SINK_NAME: ParquetSink(storage)}

    def open_writer(
        self, plan: SinkPlan, io: ThreadPoolExecutor, context: SinkWriterContext
    ) -> ParquetSinkWriter:
        options: ParquetOptions = plan.options
        return ParquetSinkWriter(
            io,
            schema=context.schema,
            dictionary=options.dictionary,
            compression=options.compression,
            staging_root=context.staging_root,
            output_root=context.output_root,
            run_id=context.run_id,
            subtask=context.subtask,
            attempt=context.attempt,
        )

    def publish_unaligned(self, staged: list[Any], storage: StorageOptions) -> None:
        publish_files(staged, storage)

    def can_replace(self, plan: SinkPlan) -> bool:
        return True  # a day's folder is replaced in one swap

    def finish_rebuilds(
        self,
        engine: Engine,
        pipeline: Pipeline,
        settings: Settings,
        sinks: Mapping[str, TransactionalSink],
    ) -> list[Rebuild]:
        root = output_root(pipeline, settings)
        return finish_rebuilds(engine, root, sinks, source=pipeline.name, folders=True)

    def committed_rows(
        self, conn: sa.Connection, pipeline: Pipeline, settings: Settings, days: list[date]
    ) -> dict[date | None, int]:
        # The prefix of the entries' "final" names: a local path or the table's URI.
        root = f"{output_root(pipeline, settings).uri}/"
        return committed_day_rows(
            conn, sink="parquet", source=pipeline.name, days=days, files=_DAY_FILES, root=root
        )

    def rows_out(
        self,
        conn: sa.Connection,
        pipeline: Pipeline,
        settings: Settings,
        days: Sequence[date | None],
    ) -> dict[date | None, int]:
        found: dict[date | None, int] = {}
        for day in days:
            folder = partition_folder(pipeline, settings, day)
            found[day] = sum(
                pq.read_metadata(path, filesystem=folder.fs).num_rows
                for path in parquet_objects(folder)
            )
        return found

    def duplicate_keys(
        self, pipeline: Pipeline, settings: Settings, day: date | None, key: list[str]
    ) -> tuple[int, list[str]]:
        folder = partition_folder(pipeline, settings, day)
        files = parquet_objects(folder)
        if not files:
            return 0, []
        table = pq.read_table(files, columns=key, filesystem=folder.fs)
        counts = table.group_by(key).aggregate([([], "count_all")])
        repeated = counts.filter(pc.greater(counts.column("count_all"), 1))
        sample = repeated.select(key).slice(0, _SAMPLE_KEYS).to_pylist()
        return table.num_rows - counts.num_rows, [str(tuple(row.values())) for row in sample]
