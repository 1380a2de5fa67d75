"""Revenue by country and day, downstream of the Iceberg clickstream pipeline (a Dagster asset
the example adds to the code location through ``examples.clickstream_iceberg.dagster_assets``,
built by ``daily_revenue_asset`` when the code location loads).

Read: the day's rows of the table ``analytics.clickstream_events`` **by snapshot** — the
snapshot current when the asset runs, recorded in the materialisation's metadata with the
table's name, so a result can be reproduced (``table.scan(snapshot_id=…)``) and told apart
from one computed before a rebuild of the day. Aggregated with Spark SQL: revenue (sum of
``order`` amounts), orders and events per ``user_country``.

Written as a Parquet day folder, ``<warehouse>/daily_revenue_by_country/dt=D/`` (one file),
through ``pyarrow.fs``: a local folder or an object store (``SLUICE_WAREHOUSE_DIR=s3://…``).
Why not an Iceberg table of its own: the aggregate is a few rows per day, fully recomputed on
each refresh, and its readers (the run-modes how-to, object-store deployments) read a Parquet
folder; an Iceberg output would need its own committer under the table's advisory lock for
no reader that asks for it. A re-run replaces the day: on a local disk the day's folder in
one atomic swap (staging folder, then ``renameat2(RENAME_EXCHANGE)``); on an object store,
which has no rename, its one object under a fixed name in one PUT.

Refresh: the asset's ``automation_condition`` (``refresh_condition``) requests a day when the
upstream day was materialised — which ``clickstream_iceberg_report_completions`` reports when
the day completes, or again when it is rebuilt — evaluated by the code location's
``AutomationConditionSensorDefinition`` (``dagster_project.definitions``).

Threading: the asset runs in its Dagster run's step; every call opens and closes its own
catalog connection and uses the process's Spark session.
"""

import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from typing import TYPE_CHECKING, Any

from dagster import (
    AssetExecutionContext,
    AssetsDefinition,
    AutomationCondition,
    BackfillPolicy,
    BetaWarning,
    MaterializeResult,
    MetadataValue,
    asset,
)

from dagster_project import SluiceResource, partition_days, partitions_of
from enumerator_service import ConfigError, Settings
from examples._revenue_output import REVENUE_TABLE, output_location, preview, replace_day
from examples.clickstream_iceberg import clickstream_iceberg
from spark_jobs.connectors.iceberg import sink_table, sink_table_name
from spark_jobs.pipeline import Pipeline, warehouse_root

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = [
    "REVENUE_TABLE",
    "DailyRevenue",
    "aggregate_days",
    "build_daily_revenue",
    "daily_revenue_asset",
    "read_days",
    "refresh_condition",
    "write_days",
]

#: The enriched columns the aggregate reads.
INPUT_COLUMNS = ("user_country", "event_type", "amount")


@dataclass(frozen=True)
class DailyRevenue:
    """What one materialisation read (table, snapshot) and wrote (the aggregate by day)."""

    table: str
    snapshot_id: int
    written: "dict[date, pa.Table]"


def _revenue_schema() -> "pa.Schema":
    import pyarrow as pa

    return pa.schema(
        [
            pa.field("user_country", pa.string()),
            pa.field("revenue", pa.float64()),
            pa.field("orders", pa.int64()),
            pa.field("events", pa.int64()),
        ]
    )


def read_days(table: Any, days: Sequence[date], snapshot_id: int) -> "dict[date, pa.Table]":
    """The ``INPUT_COLUMNS`` of each day's rows in snapshot ``snapshot_id`` of ``table`` (a
    PyIceberg table partitioned by ``day(event_time)``): a scan per day, its filter on the
    UTC day's event times (the partitions prune the files)."""
    from pyiceberg.expressions import And, GreaterThanOrEqual, LessThan

    read = {}
    for day in days:
        start = datetime.combine(day, time(), UTC)
        day_filter = And(
            GreaterThanOrEqual("event_time", start.isoformat()),
            LessThan("event_time", (start + timedelta(days=1)).isoformat()),
        )
        scan = table.scan(
            row_filter=day_filter, selected_fields=INPUT_COLUMNS, snapshot_id=snapshot_id
        )
        read[day] = scan.to_arrow()
    return read


def aggregate_days(settings: Settings, events: "dict[date, pa.Table]") -> "dict[date, pa.Table]":
    """Revenue, orders and events by user country of each day's ``events`` (Spark SQL); a
    day without events gets an empty table."""
    import pyarrow as pa
    import pyarrow.compute as pc

    from spark_jobs import spark_for

    parts = [
        rows.select(list(INPUT_COLUMNS)).append_column(
            "dt", pa.array([day.isoformat()] * len(rows))
        )
        for day, rows in events.items()
        if rows.num_rows
    ]
    result = None
    if parts:
        spark = spark_for(settings)
        spark.createDataFrame(pa.concat_tables(parts)).createOrReplaceTempView("enriched_events")
        result = spark.sql(
            "SELECT dt, user_country, "
            "CAST(COALESCE(SUM(CASE WHEN event_type = 'order' THEN amount END), 0) "
            "AS DOUBLE) AS revenue, "
            "COUNT_IF(event_type = 'order') AS orders, COUNT(*) AS events "
            "FROM enriched_events GROUP BY 1, 2"
        ).toArrow()
    schema = _revenue_schema()
    by_day = {}
    for day in events:
        if result is None:
            by_day[day] = schema.empty_table()
        else:
            rows = result.filter(pc.equal(result.column("dt"), day.isoformat()))
            by_day[day] = rows.select(schema.names).cast(schema)
    return by_day


def write_days(settings: Settings, written: "dict[date, pa.Table]") -> None:
    """Each day's aggregate as the one file of ``<warehouse>/daily_revenue_by_country/dt=D``."""
    target = warehouse_root(settings).child(REVENUE_TABLE)
    for day, table in written.items():
        replace_day(target, day, table)


def build_daily_revenue(
    settings: Settings, days: Sequence[date], upstream: Pipeline = clickstream_iceberg
) -> DailyRevenue:
    """Read ``days`` from the current snapshot of ``upstream``'s Iceberg table, aggregate,
    write; returns the table, the snapshot read and what was written. The table must exist
    and have a snapshot: an upstream that never committed is an error, not an empty result."""
    table = sink_table(upstream, settings)
    snapshot = table.current_snapshot()
    name = sink_table_name(upstream)
    if snapshot is None:
        raise ConfigError(
            f"pipeline {upstream.name}: IcebergSink(table)",
            f"{name} has no snapshot yet (no checkpoint of the pipeline has completed)",
        )
    written = aggregate_days(settings, read_days(table, days, snapshot.snapshot_id))
    write_days(settings, written)
    return DailyRevenue(name, snapshot.snapshot_id, written)


def refresh_condition() -> AutomationCondition:
    """Request a day once its upstream day was (re)materialised since this day was last
    requested or materialised, when no upstream day is missing or in progress and this day is
    not being computed.

    Not ``eager()``: it also requests newly *missing* partitions (a day added to the dynamic
    partitions before it completed) and, with daily partitions, only the latest day — a
    rebuilt older day would never refresh.
    """
    return (
        AutomationCondition.any_deps_updated().since_last_handled()
        & ~AutomationCondition.any_deps_missing()
        & ~AutomationCondition.any_deps_in_progress()
        & ~AutomationCondition.in_progress()
    ).with_label("upstream_day_completed")


def daily_revenue_asset(
    settings: Settings, upstream: Pipeline = clickstream_iceberg
) -> AssetsDefinition:
    """The ``daily_revenue_by_country`` asset downstream of ``upstream`` (an Iceberg
    pipeline of the clickstream's output fields: the example's, or a test's), with the
    partitions ``settings`` give it (built when the code location loads: the settings are
    read then, not when this module is imported)."""
    # BackfillPolicy is a beta parameter of @asset in dagster 1.13: opting in is deliberate.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", BetaWarning)

        @asset(
            name=REVENUE_TABLE,
            partitions_def=partitions_of(upstream, settings),
            backfill_policy=BackfillPolicy.single_run(),
            deps=[upstream.name],
            group_name=upstream.name,
            kinds={"spark", "iceberg", "parquet"},
            automation_condition=refresh_condition(),
        )
        def daily_revenue_by_country(
            context: AssetExecutionContext, sluice: SluiceResource
        ) -> MaterializeResult[None]:
            """Revenue (sum of order amounts), orders and events per user country and day,
            from a snapshot of the Iceberg clickstream table (named in the metadata)."""
            return _materialize(context, sluice.settings(), upstream)

    return daily_revenue_by_country


def _column_sum(table: "pa.Table", column: str) -> float:
    import pyarrow.compute as pc

    total = pc.sum(table.column(column)).as_py()
    return float(total) if total is not None else 0.0


def _materialize(
    context: AssetExecutionContext, settings: Settings, upstream: Pipeline
) -> MaterializeResult[None]:
    days = partition_days(context)
    built = build_daily_revenue(settings, days, upstream)
    written = built.written
    rows = sum(table.num_rows for table in written.values())
    revenue = sum(_column_sum(table, "revenue") for table in written.values())
    orders = sum(_column_sum(table, "orders") for table in written.values())
    events = sum(_column_sum(table, "events") for table in written.values())
    context.log.info(
        f"{days[0]}..{days[-1]} from {built.table} snapshot {built.snapshot_id}: {rows} rows, "
        f"revenue {revenue:,.2f}"
    )
    return MaterializeResult(
        metadata={
            "source_table": MetadataValue.text(built.table),
            "source_snapshot_id": MetadataValue.int(built.snapshot_id),
            "row_count": MetadataValue.int(rows),
            "revenue": MetadataValue.float(float(revenue)),
            "orders": MetadataValue.int(int(orders)),
            "events": MetadataValue.int(int(events)),
            "preview": MetadataValue.md(preview(written)),
            "output_path": MetadataValue.path(output_location(settings, days)),
            "partitions": MetadataValue.int(len(days)),
            "partition_range": MetadataValue.text(f"{days[0]}..{days[-1]}"),
        }
    )
