"""Revenue by country and day, downstream of the clickstream pipeline (a Dagster asset the
example adds to the code location through ``examples.clickstream.dagster_assets``, built by
``daily_revenue_asset`` when the code location loads).

Spark SQL over a day's enriched Parquet: revenue (sum of ``order`` amounts), orders and events
per ``user_country``, written to ``<warehouse>/daily_revenue_by_country/dt=D/`` (one file).
Files are read and written through ``pyarrow.fs``, so the warehouse may be a local folder or
an object store (``SLUICE_WAREHOUSE_DIR=s3://…``). A re-run replaces the day: on a local disk
the day's folder in one atomic swap (staging folder, then ``renameat2(RENAME_EXCHANGE)``); on
an object store, which has no rename, its one object under a fixed name in one PUT.
"""

import shutil
import uuid
import warnings
from collections.abc import Sequence
from datetime import date
from typing import TYPE_CHECKING

from dagster import (
    AssetExecutionContext,
    AssetsDefinition,
    BackfillPolicy,
    BetaWarning,
    MaterializeResult,
    MetadataValue,
    asset,
)

from dagster_project import SluiceResource, parquet_objects, partition_days, partitions_of
from enumerator_service import Location, Settings
from examples.clickstream import clickstream
from spark_jobs.connectors.parquet import output_root
from spark_jobs.pipeline import warehouse_root

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = ["REVENUE_TABLE", "build_daily_revenue", "daily_revenue_asset"]

#: Folder of the aggregate under the warehouse root.
REVENUE_TABLE = "daily_revenue_by_country"
#: Rows of the markdown preview.
PREVIEW_ROWS = 20


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


def build_daily_revenue(settings: Settings, days: Sequence[date]) -> "dict[date, pa.Table]":
    """Revenue, orders and events by user country of each day (Spark SQL); returns what was
    written, by day."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from spark_jobs import spark_for

    source = output_root(clickstream, settings)
    target = warehouse_root(settings).child(REVENUE_TABLE)
    # Read through pyarrow.fs (a local folder or an object store alike: Spark needs no
    # Hadoop connector for s3://), then aggregate with Spark SQL.
    parts = []
    for day in days:
        folder = source.child(f"dt={day.isoformat()}")
        files = parquet_objects(folder)
        if files:
            events = pq.read_table(files, filesystem=folder.fs, columns=list(_INPUT_COLUMNS))
            parts.append(events.append_column("dt", pa.array([day.isoformat()] * len(events))))
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
    written: dict[date, pa.Table] = {}
    for day in days:
        if result is None:
            written[day] = _revenue_schema().empty_table()
        else:
            rows = result.filter(pc.equal(result.column("dt"), day.isoformat()))
            written[day] = rows.select(_revenue_schema().names).cast(_revenue_schema())
        _replace_day(target, day, written[day])
    return written


#: The enriched columns the aggregate reads.
_INPUT_COLUMNS = ("user_country", "event_type", "amount")


def _replace_day(target: Location, day: date, table: "pa.Table") -> None:
    """Make ``table`` the one file of ``target/dt=D``, replacing the previous one.

    A local folder is replaced in one atomic swap (a staging folder, then
    ``renameat2(RENAME_EXCHANGE)``). An object store has no rename: the day is one object with
    a fixed name, replaced by one PUT (a reader sees the previous object or the new one,
    whole), and any other object left in the folder is deleted after it.
    """
    import pyarrow.parquet as pq

    from spark_jobs.sink import replace_folder

    folder = target.child(f"dt={day.isoformat()}")
    if target.object_store:
        name = "part-00000.parquet"
        pq.write_table(table, folder.child(name).path, filesystem=folder.fs)
        for path in parquet_objects(folder):
            if not path.endswith("/" + name):
                folder.fs.delete_file(path)
        return
    # "_" folders are invisible to Spark and pyarrow readers of the table.
    staging = target.local_path / f"_staging-{uuid.uuid4().hex}"
    try:
        new = staging / f"dt={day.isoformat()}"
        new.mkdir(parents=True)
        pq.write_table(table, new / f"part-{uuid.uuid4().hex[:12]}.parquet")
        replace_folder(new, folder.local_path)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _column_sum(table: "pa.Table", column: str) -> float:
    import pyarrow.compute as pc

    total = pc.sum(table.column(column)).as_py()
    return float(total) if total is not None else 0.0


def _preview(written: "dict[date, pa.Table]") -> str:
    """A markdown table of the first rows (by day, then revenue, highest first)."""
    lines = ["| dt | user_country | revenue | orders | events |", "|---|---|---:|---:|---:|"]
    shown, total = 0, sum(table.num_rows for table in written.values())
    for day, table in sorted(written.items()):
        for row in table.sort_by([("revenue", "descending")]).to_pylist():
            if shown == PREVIEW_ROWS:
                lines.append(f"| … | {total - shown} more rows | | | |")
                return "\n".join(lines)
            country = row["user_country"] if row["user_country"] is not None else "(unknown)"
            lines.append(
                f"| {day.isoformat()} | {country} | {row['revenue']:,.2f} | {row['orders']} "
                f"| {row['events']} |"
            )
            shown += 1
    return "\n".join(lines)


def daily_revenue_asset(settings: Settings) -> AssetsDefinition:
    """The ``daily_revenue_by_country`` asset, with the partitions ``settings`` give the
    clickstream pipeline (built when the code location loads: the settings are read then, not
    when this module is imported)."""
    # BackfillPolicy is a beta parameter of @asset in dagster 1.13: opting in is deliberate.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", BetaWarning)

        @asset(
            name=REVENUE_TABLE,
            partitions_def=partitions_of(clickstream, settings),
            backfill_policy=BackfillPolicy.single_run(),
            deps=[clickstream.name],
            group_name=clickstream.name,
            kinds={"spark", "parquet"},
        )
        def daily_revenue_by_country(
            context: AssetExecutionContext, sluice: SluiceResource
        ) -> MaterializeResult[None]:
            """Revenue (sum of order amounts), orders and events per user country and day."""
            return _materialize(context, sluice.settings())

    return daily_revenue_by_country


def _materialize(context: AssetExecutionContext, settings: Settings) -> MaterializeResult[None]:
    days = partition_days(context)
    written = build_daily_revenue(settings, days)
    rows = sum(table.num_rows for table in written.values())
    revenue = sum(_column_sum(table, "revenue") for table in written.values())
    orders = sum(_column_sum(table, "orders") for table in written.values())
    events = sum(_column_sum(table, "events") for table in written.values())
    context.log.info(f"{days[0]}..{days[-1]}: {rows} rows, revenue {revenue:,.2f}")
    output = warehouse_root(settings).child(REVENUE_TABLE)
    if len(days) == 1:
        output = output.child(f"dt={days[0].isoformat()}")
    return MaterializeResult(
        metadata={
            "row_count": MetadataValue.int(rows),
            "revenue": MetadataValue.float(float(revenue)),
            "orders": MetadataValue.int(int(orders)),
            "events": MetadataValue.int(int(events)),
            "preview": MetadataValue.md(_preview(written)),
            "output_path": MetadataValue.path(output.uri),
            "partitions": MetadataValue.int(len(days)),
            "partition_range": MetadataValue.text(f"{days[0]}..{days[-1]}"),
        }
    )
