"""A lakehouse pipeline's table maintenance in Dagster: compaction of each completed day, and
snapshot expiry plus orphan removal every day.

Built by the factory for a pipeline whose sink connector overrides
``SinkConnector.maintenance`` (an Iceberg or Delta sink); the hook is only called when a run
or a tick starts, never when the code location loads.

- ``<pipeline>_compact`` (partitioned like the output): compacts the run's partition (a day)
  of the output table — ``TableMaintenance.compact_day``: one commit, a no-op when the day
  has ≤ 1 file — with the result as the op's output metadata.
- ``<pipeline>_compact_completed_days`` (sensor, running by default): a day is complete when
  its partition of the output asset is materialised — by ``<pipeline>_report_completions``
  (runless, once per completed generation) or by an asset run of that day. The sensor reads
  the output's materialisations after its cursor (the event-log storage id), in order, and
  requests one compaction run per materialisation, run key
  ``<pipeline>:compact:<day>:<storage id>`` (a tick repeated after a crash requests the same
  run, which Dagster launches once). A day reopened and completed again is compacted again.
- ``<pipeline>_table_maintenance`` (unpartitioned): ``expire`` then ``remove_orphans`` with
  the retention and grace of its run configuration; ``<pipeline>_table_maintenance_schedule``
  runs it daily at 03:00 UTC (running by default).

Every operation holds the table's advisory lock (see ``spark_jobs.connectors``), so these runs
never race a checkpoint's commit nor each other.

Threading: ops run in the run's process; the sensor on the daemon's sensor thread; each run
opens and disposes its own database engine.
"""

# No "from __future__ import annotations": Dagster inspects the context annotations.

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import date, timedelta
from typing import Any

from dagster import (
    AssetKey,
    AssetRecordsFilter,
    Config,
    DefaultScheduleStatus,
    DefaultSensorStatus,
    JobDefinition,
    MetadataValue,
    OpExecutionContext,
    Output,
    PartitionsDefinition,
    RunRequest,
    ScheduleDefinition,
    SensorDefinition,
    SensorEvaluationContext,
    SensorResult,
    SkipReason,
    job,
    op,
    sensor,
)
from pydantic import Field

from dagster_project._runs import PIPELINE_TAG
from dagster_project.resources import SluiceResource
from enumerator_service import Settings, open_platform
from spark_jobs.connectors import (
    DEFAULT_GRACE,
    DEFAULT_RETENTION,
    SinkConnector,
    TableMaintenance,
    sink_connector_named,
)
from spark_jobs.pipeline import Pipeline

__all__ = [
    "MaintenanceConfig",
    "compaction_job",
    "compaction_sensor",
    "has_maintenance",
    "maintenance_job",
    "maintenance_schedule",
]

#: Materialisations read per sensor tick at most (the rest: next tick).
_BATCH = 100


def has_maintenance(pipeline: Pipeline) -> bool:
    """Whether ``pipeline``'s sink connector offers table maintenance (it overrides
    ``SinkConnector.maintenance``): decided without calling it (no database at load)."""
    connector = sink_connector_named(pipeline.plan.sink.kind)
    return type(connector).maintenance is not SinkConnector.maintenance


@contextmanager
def _maintenance(pipeline: Pipeline, settings: Settings) -> Iterator[TableMaintenance]:
    """The pipeline's table maintenance on an engine of its own (disposed at the end)."""
    engine = open_platform(settings, migrate=False, pool_size=1).engine
    try:
        connector = sink_connector_named(pipeline.plan.sink.kind)
        found = connector.maintenance(engine, pipeline, settings)
        if found is None:
            raise RuntimeError(
                f"sink connector {connector.name!r} of pipeline {pipeline.name} returned no "
                "table maintenance"
            )
        yield found
    finally:
        engine.dispose()


def _plain(values: dict[str, Any]) -> dict[str, Any]:
    """Metadata values of a result (None left out)."""
    return {key: value for key, value in values.items() if value is not None}


def compaction_job(pipeline: Pipeline, partitions: PartitionsDefinition) -> JobDefinition:
    """``<pipeline>_compact``: compact the run's partition (a day) of the output table."""

    @op(name=f"{pipeline.name}_compact_day")
    def compact(context: OpExecutionContext, sluice: SluiceResource) -> Output[None]:
        day = date.fromisoformat(context.partition_key)
        with _maintenance(pipeline, sluice.settings()) as maintenance:
            done = maintenance.compact_day(day)
        context.log.info(
            f"{done.table} {day}: "
            + ("nothing to compact" if done.skipped else f"{done.files_before} files → ")
            + ("" if done.skipped else f"{done.files_after} (snapshot {done.snapshot})")
        )
        return Output(
            None,
            metadata=_plain(
                {
                    "table": MetadataValue.text(done.table),
                    "day": MetadataValue.text(day.isoformat()),
                    "files_before": done.files_before,
                    "files_after": done.files_after,
                    "rows": done.rows,
                    "bytes_before": done.bytes_before,
                    "bytes_after": done.bytes_after,
                    "snapshot": None if done.snapshot is None else str(done.snapshot),
                    "skipped": done.skipped,
                }
            ),
        )

    @job(
        name=f"{pipeline.name}_compact",
        partitions_def=partitions,
        description=f"Compact one day of pipeline {pipeline.name}'s output table (one commit).",
        tags={PIPELINE_TAG: pipeline.name},
    )
    def _job() -> None:
        compact()

    return _job


def compaction_sensor(pipeline: Pipeline, key: AssetKey, job: JobDefinition) -> SensorDefinition:
    """``<pipeline>_compact_completed_days``: a compaction run per completed day (see the
    module's docstring)."""

    @sensor(
        name=f"{pipeline.name}_compact_completed_days",
        job=job,
        minimum_interval_seconds=60,
        default_status=DefaultSensorStatus.RUNNING,
        description=f"Compacts each day of {pipeline.name}'s output table once it is complete.",
    )
    def _sensor(context: SensorEvaluationContext) -> SensorResult | SkipReason:
        after = int(context.cursor) if context.cursor else None
        page = context.instance.fetch_materializations(
            AssetRecordsFilter(asset_key=key, after_storage_id=after),
            limit=_BATCH,
            ascending=True,
        )
        if not page.records:
            return SkipReason(f"no newly completed day of {pipeline.name}")
        # One run per day of the page, however often it was materialised (a day reported,
        # then rebuilt; a first start of the UI over many days the CLI processed).
        latest = {r.partition_key: r.storage_id for r in page.records if r.partition_key}
        requests = [
            RunRequest(
                run_key=f"{pipeline.name}:compact:{day}:{storage_id}",
                partition_key=day,
                tags={PIPELINE_TAG: pipeline.name},
            )
            for day, storage_id in latest.items()
        ]
        cursor = str(page.records[-1].storage_id)
        return SensorResult(run_requests=requests, cursor=cursor)

    return _sensor


class MaintenanceConfig(Config):
    """How old a snapshot / an unreferenced file must be to go."""

    retention_hours: float = Field(
        default=DEFAULT_RETENTION.total_seconds() / 3600,
        ge=0.0,
        description="Snapshots (Delta: removed files) older than this are expired.",
    )
    grace_hours: float = Field(
        default=DEFAULT_GRACE.total_seconds() / 3600,
        ge=0.0,
        description="Unreferenced files younger than this are never removed (a checkpoint "
        "being committed writes its files first).",
    )


def maintenance_job(pipeline: Pipeline) -> JobDefinition:
    """``<pipeline>_table_maintenance``: expire old snapshots, then remove orphan files."""

    @op(name=f"{pipeline.name}_expire_and_remove_orphans")
    def expire_and_sweep(
        context: OpExecutionContext, config: MaintenanceConfig, sluice: SluiceResource
    ) -> Output[None]:
        with _maintenance(pipeline, sluice.settings()) as maintenance:
            expired = maintenance.expire(timedelta(hours=config.retention_hours))
            swept = maintenance.remove_orphans(timedelta(hours=config.grace_hours))
        context.log.info(
            f"{expired.table}: {expired.snapshots_before} → {expired.snapshots_after} "
            f"snapshots; {swept.orphans_removed} orphan files removed, {swept.young_kept} "
            "younger than the grace kept"
        )
        return Output(
            None,
            metadata=_plain(
                {
                    "table": MetadataValue.text(expired.table),
                    "snapshots_before": expired.snapshots_before,
                    "snapshots_after": expired.snapshots_after,
                    "current": None if expired.current is None else str(expired.current),
                    "files_removed_by_expiry": expired.files_removed,
                    "files_seen": swept.files_seen,
                    "orphans_removed": swept.orphans_removed,
                    "orphan_bytes_removed": swept.bytes_removed,
                    "young_unreferenced_kept": swept.young_kept,
                }
            ),
        )

    @job(
        name=f"{pipeline.name}_table_maintenance",
        description=f"Expire old snapshots of pipeline {pipeline.name}'s output table and "
        "remove its orphan files.",
        tags={PIPELINE_TAG: pipeline.name},
    )
    def _job() -> None:
        expire_and_sweep()

    return _job


def maintenance_schedule(pipeline: Pipeline, job: JobDefinition) -> ScheduleDefinition:
    """``<pipeline>_table_maintenance_schedule``: the maintenance job daily at 03:00 UTC."""
    return ScheduleDefinition(
        name=f"{pipeline.name}_table_maintenance_schedule",
        job=job,
        cron_schedule="0 3 * * *",
        execution_timezone="UTC",
        default_status=DefaultScheduleStatus.RUNNING,
        description=f"Daily at 03:00 UTC: expire old snapshots of {pipeline.name}'s output "
        "table and remove its orphan files.",
    )
