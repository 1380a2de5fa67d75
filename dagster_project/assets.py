"""A pipeline's output asset and its partitions.

The asset of pipeline ``P`` is ``P``: materialising a partition (a day of a day-partitioned
source) discovers that day's files and processes them; a backfill runs once for its whole
range of days. A day processed before is re-read from scratch and its output replaced when
all of it is committed (a Parquet folder swap; an upsert sink's rows are written again): never
duplicated, never half-replaced if the run dies. An unpartitioned pipeline's asset processes
everything discovered: the whole backlog of new input is registered first, as the incremental
job's run does (for such a pipeline that job *is* a materialisation of this asset, see
``jobs.incremental_job``); a run of it that processed no split materialises nothing.
"""

import warnings
from collections.abc import Iterator, Sequence
from datetime import UTC, date, datetime
from typing import Any

from dagster import (
    AssetExecutionContext,
    AssetKey,
    AssetsDefinition,
    BackfillPolicy,
    BetaWarning,
    DailyPartitionsDefinition,
    DynamicPartitionsDefinition,
    MaterializeResult,
    MetadataValue,
    asset,
)

from dagster_project._runs import (
    describe_run,
    discover_and_run,
    drain_and_run,
    sluice_run_id,
    summary_metadata,
)
from dagster_project.resources import SluiceResource
from enumerator_service import Settings, partition_date
from spark_jobs.connectors import sink_connector_named, source_connector_named
from spark_jobs.pipeline import Pipeline

__all__ = [
    "DayPartitions",
    "output_asset",
    "output_location",
    "output_metadata",
    "partition_days",
    "partitions_name",
    "partitions_of",
]

#: A day-partitioned output's partitions: every day from a start, or the days discovered.
DayPartitions = DailyPartitionsDefinition | DynamicPartitionsDefinition

_PARTITIONS: dict[str, DailyPartitionsDefinition] = {}


def _earliest_day(pipeline: Pipeline, settings: Settings) -> date | None:
    """The earliest day the source has input for (a landing ``dt=`` folder holding a data
    file), or None."""
    connector = source_connector_named(pipeline.plan.source.kind)
    return min(connector.input_days(pipeline, settings) or (), default=None)


def partitions_name(pipeline: Pipeline) -> str:
    """The name of a pipeline's dynamic partitions (``SLUICE_DAGSTER_PARTITIONS=discovered``)."""
    return f"{pipeline.name}_days"


def partitions_of(pipeline: Pipeline, settings: Settings) -> DayPartitions | None:
    """The partitions of a day-partitioned pipeline (None otherwise), the same object for
    every asset of the pipeline.

    ``SLUICE_DAGSTER_PARTITIONS=discovered`` (default): dynamic partitions
    ``<pipeline>_days``, the days that have input or output (added by
    ``<pipeline>_report_completions``, see ``_partitions.sync_partitions``): the UI offers
    the days the data has, not every day since a start date. ``daily``: daily from its
    ``start_date``, else from the earliest ``dt=`` folder of its landing folder when the code
    location loads, else today.
    """
    if not pipeline.plan.source.partitioned:
        return None
    if settings.dagster_partitions == "discovered":
        return DynamicPartitionsDefinition(name=partitions_name(pipeline))
    known = _PARTITIONS.get(pipeline.name)
    if known is None:
        start = pipeline.plan.source.start_date or _earliest_day(pipeline, settings)
        start = start or datetime.now(UTC).date()
        known = _PARTITIONS[pipeline.name] = DailyPartitionsDefinition(start_date=start.isoformat())
    return known


def partition_days(context: AssetExecutionContext) -> list[date]:
    """The days of the run: one partition, or every day of a single-run backfill's range."""
    return [partition_date(key, "Dagster partition key") for key in context.partition_keys]


def output_metadata(
    pipeline: Pipeline, settings: Settings, run_id: str | None
) -> dict[str, MetadataValue[Any]]:
    """What the sink connector tells about its output now (a table's URI, snapshot, what
    ``run_id`` added), as Dagster metadata."""
    connector = sink_connector_named(pipeline.plan.sink.kind)
    return {
        key: MetadataValue.int(value) if isinstance(value, int) else MetadataValue.text(value)
        for key, value in connector.output_metadata(pipeline, settings, run_id).items()
    }


def output_location(pipeline: Pipeline, settings: Settings, days: Sequence[date] | None) -> str:
    """Where the output of ``days`` is (a folder, or a table and its ``dt`` values)."""
    connector = sink_connector_named(pipeline.plan.sink.kind)
    return connector.location(pipeline, settings, days or ())


def output_asset(
    pipeline: Pipeline, partitions: DayPartitions | None, deps: Sequence[AssetKey]
) -> AssetsDefinition:
    """The asset ``pipeline.name``: the pipeline's output."""
    kinds = {"spark", pipeline.plan.sink.kind}
    description = (pipeline.description or f"The output of pipeline {pipeline.name}.") + (
        " Materialising a day processes its files; a day processed before is replaced."
        if partitions is not None
        else " Materialising processes everything discovered and not yet processed."
    )
    # BackfillPolicy is a beta parameter of @asset in dagster 1.13: opting in is deliberate.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", BetaWarning)

        @asset(
            name=pipeline.name,
            partitions_def=partitions,
            backfill_policy=BackfillPolicy.single_run() if partitions is not None else None,
            deps=list(deps),
            group_name=pipeline.name,
            kinds=kinds,
            description=description,
            # An unpartitioned output is not materialised by a run that processed no split
            # (nothing new, or every split is a live continuous run's): its data is as before.
            output_required=partitions is not None,
        )
        def _output(
            context: AssetExecutionContext, sluice: SluiceResource
        ) -> Iterator[MaterializeResult[None]]:
            settings = sluice.settings()
            days = partition_days(context) if partitions is not None else None
            run_id = sluice_run_id(context.run)
            if days is None:
                discovery, summary = drain_and_run(settings, pipeline, run_id=run_id)
            else:
                discovery, summary = discover_and_run(
                    settings, pipeline, days, run_id=run_id, rebuild=True
                )
            span = f"{days[0]}..{days[-1]}: " if days else ""
            context.log.info(
                f"{span}{discovery.splits_registered} new splits; {describe_run(summary)}"
            )
            if days is None and not summary.splits:
                context.log.info("no split processed: the output is unchanged, not materialised")
                return
            metadata: dict[str, Any] = summary_metadata(
                discovery, summary, output_location(pipeline, settings, days)
            )
            metadata.update(output_metadata(pipeline, settings, summary.run_id))
            if days:
                metadata["partitions"] = MetadataValue.int(len(days))
                metadata["partition_range"] = MetadataValue.text(f"{days[0]}..{days[-1]}")
            yield MaterializeResult(metadata=metadata)

    return _output
