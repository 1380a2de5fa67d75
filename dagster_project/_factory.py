"""Everything Dagster knows of one pipeline, built from its definition."""

from __future__ import annotations

from dataclasses import dataclass, field

from dagster import (
    AssetChecksDefinition,
    AssetKey,
    AssetsDefinition,
    JobDefinition,
    ScheduleDefinition,
    SensorDefinition,
)

from dagster_project.assets import DayPartitions, output_asset, partitions_of
from dagster_project.checks import pipeline_checks
from dagster_project.completions import report_completions_sensor
from dagster_project.continuous import continuous_job, continuous_sensor
from dagster_project.jobs import IncrementalJob, incremental_job
from dagster_project.live import freshness_check, live_state_sensor
from dagster_project.maintenance import (
    compaction_job,
    compaction_sensor,
    has_maintenance,
    maintenance_job,
    maintenance_schedule,
)
from dagster_project.observations import table_asset, upstream_assets
from dagster_project.schedules import incremental_schedule
from dagster_project.sensors import new_files_sensor
from enumerator_service import Settings
from spark_jobs.connectors import source_connector_named
from spark_jobs.pipeline import Pipeline

__all__ = ["PipelineDefinitions", "pipeline_definitions"]


@dataclass
class PipelineDefinitions:
    """A pipeline's assets, checks, jobs, sensors and schedule (``source_assets``: its landing
    folder or source table and its lookup tables — shared tables appear once per pipeline
    here; the code location keeps one of each key)."""

    pipeline: Pipeline
    partitions: DayPartitions | None
    output: AssetsDefinition
    source_assets: list[AssetsDefinition]
    checks: list[AssetChecksDefinition]
    #: ``watermark_freshness``: unpartitioned, evaluated by the live-state sensor (not with
    #: each partition's materialisation, unlike ``checks``).
    freshness: AssetChecksDefinition
    incremental_job: IncrementalJob
    continuous_job: JobDefinition
    sensors: list[SensorDefinition] = field(default_factory=list)
    schedules: list[ScheduleDefinition] = field(default_factory=list)
    #: A lakehouse sink's table maintenance (``dagster_project.maintenance``): the compaction
    #: of a completed day (day-partitioned pipelines) and the daily expiry and orphan removal.
    maintenance_jobs: list[JobDefinition] = field(default_factory=list)

    @property
    def jobs(self) -> list[IncrementalJob]:
        return [self.incremental_job, self.continuous_job, *self.maintenance_jobs]


def pipeline_definitions(pipeline: Pipeline, settings: Settings) -> PipelineDefinitions:
    """Build them; ``settings`` only for what the code location decides when it loads (the
    first partition of a pipeline without a ``start_date``)."""
    plan = pipeline.plan
    partitions = partitions_of(pipeline, settings)
    sources: list[AssetsDefinition] = []
    sources.extend(upstream_assets(pipeline))
    for lookup in plan.lookups():
        sources.append(
            table_asset(
                lookup.schema_name,
                lookup.table,
                group=pipeline.name,
                used_by=f"{pipeline.name} ({lookup.where})",
                url_env=lookup.url_env,
            )
        )
    deps: list[AssetKey] = []
    for source in sources:
        for key in source.keys:
            if key not in deps:
                deps.append(key)
    output = output_asset(pipeline, partitions, deps)
    checks = pipeline_checks(pipeline, output.key, partitions)
    incremental = incremental_job(pipeline, output, checks)
    continuous = continuous_job(pipeline)
    built = PipelineDefinitions(
        pipeline=pipeline,
        partitions=partitions,
        output=output,
        source_assets=sources,
        checks=checks,
        freshness=freshness_check(pipeline, output.key),
        incremental_job=incremental,
        continuous_job=continuous,
        sensors=[
            *([] if _is_stream(pipeline) else [new_files_sensor(pipeline, incremental)]),
            continuous_sensor(pipeline, continuous),
            report_completions_sensor(
                pipeline,
                output.key,
                [key for check in checks for key in check.check_keys],
                partitions,
            ),
            live_state_sensor(pipeline, output.key, partitions is not None),
        ],
        schedules=[incremental_schedule(pipeline, incremental)],
    )
    if has_maintenance(pipeline):
        _add_maintenance(built)
    return built


def _is_stream(pipeline: Pipeline) -> bool:
    """A log source (Kafka, CDC): no ``<P>_new_files`` sensor (see ``SourceConnector.stream``)."""
    return source_connector_named(pipeline.plan.source.kind).stream


def _add_maintenance(built: PipelineDefinitions) -> None:
    """The table maintenance jobs, sensor and schedule of a lakehouse sink's pipeline."""
    pipeline = built.pipeline
    if built.partitions is not None:
        compact = compaction_job(pipeline, built.partitions)
        built.maintenance_jobs.append(compact)
        built.sensors.append(compaction_sensor(pipeline, built.output.key, compact))
    expire = maintenance_job(pipeline)
    built.maintenance_jobs.append(expire)
    built.schedules.append(maintenance_schedule(pipeline, expire))
