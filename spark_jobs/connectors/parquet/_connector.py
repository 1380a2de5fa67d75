"""The Parquet sink connector: files staged per checkpoint, published into the table folder
when the checkpoint completes (:mod:`spark_jobs.sink._parquet`); a day is rebuilt by a
folder swap (:mod:`spark_jobs.sink._rebuild_swap`).

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

from enumerator_service import Settings, TransactionalSink
from spark_jobs.connectors._interface import SinkConnector, SinkDetails, SinkWriterContext
from spark_jobs.pipeline._checks import names, require
from spark_jobs.pipeline._errors import check_identifier
from spark_jobs.pipeline._paths import output_path
from spark_jobs.sink._parquet import SINK_NAME, ParquetSink, ParquetSinkWriter

if TYPE_CHECKING:
    from spark_jobs.pipeline._checks import Context
    from spark_jobs.pipeline._definition import Pipeline
    from spark_jobs.pipeline._plan import Column, Plan, SinkPlan

__all__ = ["ParquetConnector", "ParquetOptions", "parquet_files", "partition_folder"]

#: Duplicated keys listed in a failed check's metadata.
_SAMPLE_KEYS = 5
_COMPRESSIONS = ("zstd", "snappy", "gzip", "lz4", "brotli", "none")


@dataclass(frozen=True, slots=True)
class ParquetOptions:
    """The table folder under the warehouse, dictionary-encoded columns, compression."""

    folder: str
    dictionary: tuple[str, ...] = ()
    compression: str = "zstd"


def parquet_files(folder: Path) -> list[Path]:
    """The data files of one table partition folder (hidden and ``_`` files are not data)."""
    if not folder.is_dir():
        return []
    return sorted(
        path
        for path in folder.iterdir()
        if path.name.endswith(".parquet") and not path.name.startswith((".", "_"))
    )


def partition_folder(pipeline: Pipeline, settings: Settings, day: date | None) -> Path:
    root = output_path(pipeline, settings)
    return root if day is None else root / f"dt={day.isoformat()}"


# Rows committed into each day's *current* generation: files published into ``dt=D`` since
# D's latest rebuild was swapped in (all of them without a rebuild), or by that rebuild.
_PARQUET_ROWS = """
WITH files AS (
    SELECT t.committed_at, f.value ->> 'final' AS final, CAST(f.value ->> 'rows' AS bigint) AS rows
    FROM sluice.sink_transactions AS t, jsonb_array_elements(t.staged) AS f(value)
    WHERE t.committed AND t.sink = 'parquet' AND t.source = :source
), latest AS (
    SELECT DISTINCT ON (partition_key) partition_key, id, swapped_at
    FROM sluice.partition_rebuilds
    WHERE source = :source AND status = 'DONE' AND partition_key = ANY(:days)
    ORDER BY partition_key, id DESC
), wanted AS (
    SELECT day FROM unnest(CAST(:days AS date[])) AS day
)
SELECT w.day, SUM(files.rows)
FROM wanted AS w
LEFT JOIN latest AS l ON l.partition_key = w.day
JOIN files ON (
    starts_with(files.final, :root || 'dt=' || w.day || '/')
    AND (l.swapped_at IS NULL OR files.committed_at > l.swapped_at)
) OR (
    l.id IS NOT NULL
    AND starts_with(files.final, :root || '_rebuilds/dt=' || w.day || '/' || l.id || '/')
)
GROUP BY w.day
"""
_ALL_PARQUET_ROWS = """
SELECT COALESCE(SUM(t.row_count), 0) FROM sluice.sink_transactions AS t
WHERE t.committed AND t.sink = 'parquet' AND t.source = :source
"""


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
        if spec.compression not in _COMPRESSIONS:
            raise ctx.fail(f"compression must be one of {', '.join(_COMPRESSIONS)}")
        return SinkDetails(ParquetOptions(folder, dictionary, spec.compression))

    def describe(self, plan: Plan) -> str:
        options: ParquetOptions = plan.sink.options
        return f"parquet {options.folder}/" + (" (dt= folders)" if plan.source.partitioned else "")

    def location(self, pipeline: Pipeline, settings: Settings, days: Sequence[date]) -> str:
        folder = output_path(pipeline, settings)
        if days and len(days) == 1:
            folder = folder / f"dt={days[0].isoformat()}"
        return str(folder)

    def committers(self, engine: Engine | None) -> Mapping[str, TransactionalSink]:
        return {SINK_NAME: ParquetSink()}

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

    def can_replace(self, plan: SinkPlan) -> bool:
        return True  # a day's folder is replaced in one swap

    def uses_folders(self, plan: SinkPlan) -> bool:
        return True

    def committed_rows(
        self, conn: sa.Connection, pipeline: Pipeline, settings: Settings, days: list[date]
    ) -> dict[date | None, int]:
        source = pipeline.name
        if not days:
            total = conn.execute(sa.text(_ALL_PARQUET_ROWS), {"source": source}).scalar_one()
            return {None: int(total)}
        query = sa.text(_PARQUET_ROWS).bindparams(sa.bindparam("days", type_=sa.ARRAY(sa.Date)))
        params = {"source": source, "days": days, "root": f"{output_path(pipeline, settings)}/"}
        return {day: int(rows) for day, rows in conn.execute(query, params)}

    def rows_out(
        self,
        conn: sa.Connection,
        pipeline: Pipeline,
        settings: Settings,
        days: Sequence[date | None],
    ) -> dict[date | None, int]:
        return {
            day: sum(
                pq.read_metadata(path).num_rows
                for path in parquet_files(partition_folder(pipeline, settings, day))
            )
            for day in days
        }

    def duplicate_keys(
        self, pipeline: Pipeline, settings: Settings, day: date | None, key: list[str]
    ) -> tuple[int, list[str]]:
        files = parquet_files(partition_folder(pipeline, settings, day))
        if not files:
            return 0, []
        table = pq.read_table(files, columns=key)
        counts = table.group_by(key).aggregate([([], "count_all")])
        repeated = counts.filter(pc.greater(counts.column("count_all"), 1))
        sample = repeated.select(key).slice(0, _SAMPLE_KEYS).to_pylist()
        return table.num_rows - counts.num_rows, [str(tuple(row.values())) for row in sample]
