"""The daily-partitioned assets: enriched events (backfill mode) and revenue by country."""

import warnings
from collections.abc import Sequence
from datetime import date
from typing import TYPE_CHECKING, Any

from dagster import (
    AssetExecutionContext,
    BackfillPolicy,
    BetaWarning,
    DailyPartitionsDefinition,
    MaterializeResult,
    MetadataValue,
    asset,
)

from dagster_project._pipeline import (
    build_daily_revenue,
    describe,
    discover_and_enrich,
    revenue_path,
    sluice_run_id,
    summary_metadata,
)
from dagster_project.observations import raw_events, users
from dagster_project.resources import SluiceResource

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = [
    "PARTITIONS_START_DATE",
    "daily_partitions",
    "daily_revenue_by_country",
    "enriched_events",
    "partition_days",
]

#: First partition of the enriched events (the demo data starts on this day too).
PARTITIONS_START_DATE = "2026-01-01"

daily_partitions = DailyPartitionsDefinition(start_date=PARTITIONS_START_DATE)

#: Rows of the markdown preview of the revenue aggregate.
PREVIEW_ROWS = 20


def partition_days(context: AssetExecutionContext) -> list[date]:
    """The days of the run: one partition, or every day of a single-run backfill's range."""
    return [date.fromisoformat(key) for key in context.partition_keys]


def _span(days: Sequence[date]) -> dict[str, MetadataValue[Any]]:
    return {
        "partitions": MetadataValue.int(len(days)),
        "partition_range": MetadataValue.text(f"{days[0].isoformat()}..{days[-1].isoformat()}"),
    }


# BackfillPolicy is a beta parameter of @asset in dagster 1.13: opting in is deliberate here.
with warnings.catch_warnings():
    warnings.simplefilter("ignore", BetaWarning)

    @asset(
        partitions_def=daily_partitions,
        backfill_policy=BackfillPolicy.single_run(),
        deps=[raw_events, users],
        group_name="sluice",
        kinds={"spark", "postgres", "parquet"},
    )
    def enriched_events(
        context: AssetExecutionContext, sluice: SluiceResource
    ) -> MaterializeResult[None]:
        """Events enriched with the users dimension, as Parquet under ``dt=<day>/``.

        Registers the landing files of the run's days as splits (bounded listing of exactly
        those ``dt=`` folders, no cursor), then runs the PySpark reader job once over those
        days' splits. A backfill runs once for its whole range of days. A day processed
        before (by an earlier materialisation or the incremental jobs) is re-read from
        scratch and its folder replaced in one swap when all of it is committed: never
        duplicated, never half-replaced if the run dies.
        """
        days = partition_days(context)
        settings = sluice.settings()
        discovery, summary = discover_and_enrich(
            settings, days, run_id=sluice_run_id(context.run), rebuild=True
        )
        context.log.info(
            f"{days[0]}..{days[-1]}: {discovery.splits_registered} new splits; {describe(summary)}"
        )
        output = settings.output_path
        if len(days) == 1:
            output = output / f"dt={days[0].isoformat()}"
        return MaterializeResult(
            metadata={**summary_metadata(discovery, summary, output), **_span(days)}
        )

    @asset(
        partitions_def=daily_partitions,
        backfill_policy=BackfillPolicy.single_run(),
        deps=[enriched_events],
        group_name="sluice",
        kinds={"spark", "parquet"},
    )
    def daily_revenue_by_country(
        context: AssetExecutionContext, sluice: SluiceResource
    ) -> MaterializeResult[None]:
        """Revenue (sum of order amounts), orders and events per user country and day.

        Spark SQL over the enriched Parquet of the run's days; each day's folder
        ``<warehouse>/daily_revenue_by_country/dt=<day>/`` is replaced as a whole.
        """
        days = partition_days(context)
        settings = sluice.settings()
        if settings.sink != "parquet":
            raise ValueError(
                f"daily_revenue_by_country reads the Parquet output (SLUICE_SINK={settings.sink})"
            )
        written = build_daily_revenue(settings, days)
        rows = sum(table.num_rows for table in written.values())
        revenue = sum(_column_sum(table, "revenue") for table in written.values())
        orders = sum(_column_sum(table, "orders") for table in written.values())
        events = sum(_column_sum(table, "events") for table in written.values())
        context.log.info(f"{days[0]}..{days[-1]}: {rows} rows, revenue {revenue:,.2f}")
        output = revenue_path(settings)
        if len(days) == 1:
            output = output / f"dt={days[0].isoformat()}"
        return MaterializeResult(
            metadata={
                "row_count": MetadataValue.int(rows),
                "revenue": MetadataValue.float(float(revenue)),
                "orders": MetadataValue.int(int(orders)),
                "events": MetadataValue.int(int(events)),
                "preview": MetadataValue.md(_preview(written)),
                "output_path": MetadataValue.path(str(output)),
                **_span(days),
            }
        )


def _column_sum(table: "pa.Table", column: str) -> float:
    import pyarrow.compute as pc

    total = pc.sum(table.column(column)).as_py()
    return float(total) if total is not None else 0.0


def _preview(written: "dict[date, pa.Table]") -> str:
    """A markdown table of the first rows (by day, then revenue, highest first)."""
    lines = [
        "| dt | user_country | revenue | orders | events |",
        "|---|---|---:|---:|---:|",
    ]
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
