"""Discovery, enrichment and the revenue aggregate, shared by the assets and the jobs."""

from __future__ import annotations

import shutil
import uuid
from collections.abc import Sequence
from datetime import date
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dagster import DagsterRun, MetadataValue

from enumerator_service import DiscoveryResult, Settings
from enumerator_service._operations import discover, open_platform

if TYPE_CHECKING:
    import pyarrow as pa

    from spark_jobs.jobs import RunSummary

__all__ = [
    "REVENUE_TABLE",
    "SLUICE_RUN_TAG",
    "build_daily_revenue",
    "describe",
    "discover_and_enrich",
    "discover_once",
    "parquet_files",
    "revenue_path",
    "sluice_run_id",
    "summary_metadata",
]

#: Folder of the revenue aggregate under the warehouse root.
REVENUE_TABLE = "daily_revenue_by_country"


#: The Sluice run (``splits.run_id``) a Dagster run works on, when it is not derived.
SLUICE_RUN_TAG = "sluice/run_id"


def sluice_run_id(run: DagsterRun) -> str:
    """The Sluice run id of a Dagster run: its tag, else ``dagster-<Dagster run id>`` (so the
    failed-run sensor can give a dead run's splits back)."""
    return run.tags.get(SLUICE_RUN_TAG) or f"dagster-{run.run_id}"


def discover_once(settings: Settings, dates: Sequence[date] | None = None) -> DiscoveryResult:
    """One discovery tick (bounded to ``dates`` when given) on a short-lived connection."""
    platform = open_platform(settings)
    try:
        return discover(platform, dates=dates)
    finally:
        platform.close()


def discover_and_enrich(
    settings: Settings,
    dates: Sequence[date] | None = None,
    *,
    run_id: str | None = None,
    rebuild: bool = False,
) -> tuple[DiscoveryResult, RunSummary]:
    """Register the splits of ``dates`` (or all new files), then process every unassigned one.

    ``run_id`` names the Sluice run (``dagster-<Dagster run id>`` from Dagster, so the
    failed-run sensor can give a dead run's splits back). ``rebuild``: days of ``dates`` that
    were processed before are processed again and their output replaced in one swap.
    """
    discovery = discover_once(settings, dates)
    # Imported here so loading the code location (and every sensor tick) never imports PySpark.
    from spark_jobs.jobs import run_enrichment

    summary = run_enrichment(
        settings,
        dates=list(dates) if dates is not None else None,
        run_id=run_id,
        rebuild=rebuild,
    )
    return discovery, summary


def describe(summary: RunSummary) -> str:
    """One log line for a finished run (no connection details)."""
    if summary.nothing_new:
        return f"run {summary.run_id}: nothing new to process"
    rebuilt = f", replaced partitions {', '.join(summary.rebuilt)}" if summary.rebuilt else ""
    return (
        f"run {summary.run_id}: {summary.splits} splits, {summary.rows_in} rows in, "
        f"{summary.rows_out} rows out, {summary.dead_letters} dead letters, "
        f"{summary.fenced} fenced, {summary.seconds:.1f}s ({summary.rows_per_second:,.0f} rows/s)"
        f"{rebuilt}"
    )


def summary_metadata(
    discovery: DiscoveryResult | None, summary: RunSummary, output: Path
) -> dict[str, MetadataValue[Any]]:
    """Dagster metadata for a run: counts, lookup and checkpoint figures, the output folder;
    discovery counts when the run discovered (a continuous reader does not).

    Never the database URL (nor anything else from the connection settings).
    """
    found: dict[str, MetadataValue[Any]] = (
        {}
        if discovery is None
        else {
            "files_seen": MetadataValue.int(discovery.files_seen),
            "splits_registered": MetadataValue.int(discovery.splits_registered),
        }
    )
    return {
        "run_id": MetadataValue.text(summary.run_id),
        **found,
        "splits": MetadataValue.int(summary.splits),
        "rows_in": MetadataValue.int(summary.rows_in),
        "rows_out": MetadataValue.int(summary.rows_out),
        "dead_letters": MetadataValue.int(summary.dead_letters),
        "fenced": MetadataValue.int(summary.fenced),
        "seconds": MetadataValue.float(float(summary.seconds)),
        "rows_per_second": MetadataValue.float(float(summary.rows_per_second)),
        "lookups": MetadataValue.int(summary.lookups),
        "lookup_queries": MetadataValue.int(summary.lookup_queries),
        "cache_hit_rate": MetadataValue.float(float(summary.cache_hit_rate)),
        "lookup_p50_ms": MetadataValue.float(float(summary.lookup_p50_ms)),
        "lookup_p99_ms": MetadataValue.float(float(summary.lookup_p99_ms)),
        "checkpoints_completed": MetadataValue.int(summary.checkpoints),
        "checkpoints_aborted": MetadataValue.int(summary.checkpoints_aborted),
        "checkpoint_p50_ms": MetadataValue.float(float(summary.checkpoint_p50_ms)),
        "checkpoint_p99_ms": MetadataValue.float(float(summary.checkpoint_p99_ms)),
        "alignment_p50_ms": MetadataValue.float(float(summary.alignment_p50_ms)),
        "nothing_new": MetadataValue.bool(summary.nothing_new),
        "rebuilt_partitions": MetadataValue.text(", ".join(summary.rebuilt) or "none"),
        "output_path": MetadataValue.path(str(output)),
    }


# --------------------------------------------------------------------------- files


def parquet_files(folder: Path) -> list[Path]:
    """The data files of one table partition folder (hidden and ``_`` files are not data)."""
    if not folder.is_dir():
        return []
    return sorted(
        path
        for path in folder.iterdir()
        if path.name.endswith(".parquet") and not path.name.startswith((".", "_"))
    )


# --------------------------------------------------------------------------- revenue


def revenue_path(settings: Settings) -> Path:
    return settings.warehouse_path / REVENUE_TABLE


def _revenue_schema() -> pa.Schema:
    import pyarrow as pa

    return pa.schema(
        [
            pa.field("user_country", pa.string()),
            pa.field("revenue", pa.float64()),
            pa.field("orders", pa.int64()),
            pa.field("events", pa.int64()),
        ]
    )


def build_daily_revenue(settings: Settings, days: Sequence[date]) -> dict[date, pa.Table]:
    """Revenue, orders and events by user country of each day's enriched events (Spark SQL).

    Reads ``<output>/dt=D`` of every day, writes ``<warehouse>/daily_revenue_by_country/dt=D``
    (one Parquet file per day, an empty one for a day without events) through a staging folder
    and swaps each day's folder into place; returns what was written, by day.
    """
    import pyarrow.parquet as pq

    # Here, not at module level: loading the code location (every sensor tick) stays light.
    from spark_jobs.sink._folders import replace_folder

    source = settings.output_path
    table = revenue_path(settings)
    # "_" folders are invisible to Spark and pyarrow readers of the table.
    staging = table / f"_staging-{uuid.uuid4().hex}"
    inputs = [source / f"dt={day.isoformat()}" for day in days]
    inputs = [folder for folder in inputs if parquet_files(folder)]
    try:
        if inputs:
            from pyspark.sql import functions as F

            from spark_jobs._spark import get_spark

            spark = get_spark(settings.spark_master, driver_host=settings.spark_driver_host)
            spark.read.option("basePath", str(source)).parquet(
                *[str(folder) for folder in inputs]
            ).createOrReplaceTempView("enriched_events")
            result = spark.sql(
                "SELECT CAST(dt AS STRING) AS dt, user_country, "
                "CAST(COALESCE(SUM(CASE WHEN event_type = 'order' THEN amount END), 0) "
                "AS DOUBLE) AS revenue, "
                "COUNT_IF(event_type = 'order') AS orders, COUNT(*) AS events "
                "FROM enriched_events GROUP BY 1, 2"
            )
            # One file per day: all of a day's groups in one task.
            result.repartition(F.col("dt")).write.partitionBy("dt").parquet(str(staging))
        written: dict[date, pa.Table] = {}
        for day in days:
            folder = staging / f"dt={day.isoformat()}"
            files = parquet_files(folder)
            if files:
                written[day] = pq.read_table(files, schema=_revenue_schema())
            else:
                folder.mkdir(parents=True, exist_ok=True)
                written[day] = _revenue_schema().empty_table()
                pq.write_table(written[day], folder / "part-00000-empty.parquet")
        for day in days:
            replace_folder(staging / f"dt={day.isoformat()}", table / f"dt={day.isoformat()}")
        return written
    finally:
        shutil.rmtree(staging, ignore_errors=True)
