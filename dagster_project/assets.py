"""The daily-partitioned enriched events asset (backfill mode)."""

from datetime import date

from dagster import (
    AssetExecutionContext,
    DailyPartitionsDefinition,
    MaterializeResult,
    asset,
)

from dagster_project._pipeline import describe, discover_and_enrich, summary_metadata
from dagster_project.resources import SluiceResource

__all__ = ["PARTITIONS_START_DATE", "daily_partitions", "enriched_events"]

#: First partition of the enriched events (the demo data starts on this day too).
PARTITIONS_START_DATE = "2026-01-01"

daily_partitions = DailyPartitionsDefinition(start_date=PARTITIONS_START_DATE)


@asset(
    partitions_def=daily_partitions,
    group_name="sluice",
    kinds={"spark", "postgres", "parquet"},
)
def enriched_events(
    context: AssetExecutionContext, sluice: SluiceResource
) -> MaterializeResult[None]:
    """Events of one day enriched with the users dimension, as Parquet under ``dt=<day>/``.

    Registers the day's landing files as splits (bounded listing, no cursor), then runs the
    PySpark reader job over that day's unassigned splits.
    """
    day = date.fromisoformat(context.partition_key)
    settings = sluice.settings()
    discovery, summary = discover_and_enrich(settings, [day])
    context.log.info(f"{day}: {discovery.splits_registered} new splits; {describe(summary)}")
    output = settings.output_path / f"dt={day.isoformat()}"
    return MaterializeResult(metadata=summary_metadata(discovery, summary, output))
