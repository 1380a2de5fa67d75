"""What the Dagster tests share: a test's demo pipeline as Dagster definitions, sensor ticks
and schedule ticks with real contexts, and what runs reported.

No ``__init__.py`` in this folder on purpose (see test_definitions.py): the test modules
import this one by its name.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
from conftest import TestSettings
from dagster import (
    DagsterInstance,
    Definitions,
    ExecuteInProcessResult,
    JobDefinition,
    ScheduleDefinition,
    SensorDefinition,
    build_sensor_context,
)
from demo_platform import demo_pipeline

from dagster_project import PipelineDefinitions, pipeline_definitions
from dagster_project.resources import SluiceResource
from enumerator_service import Settings, SplitStore, connect_engine
from spark_jobs import Pipeline

__all__ = [
    "demo_definitions",
    "incremental_job_of",
    "parquet_rows",
    "schedule_of",
    "sensor_named",
    "sensor_tick",
    "split_counts",
    "step_output",
    "with_start_date",
]


def with_start_date(pipeline: Pipeline, settings: Settings) -> Pipeline:
    """``pipeline`` with its first Dagster partition on ``settings.demo_start_date`` (not on
    the earliest landing folder when the definitions are built, nor today)."""
    source = dataclasses.replace(pipeline.source, start_date=settings.demo_start_date)
    return dataclasses.replace(pipeline, source=source)


def demo_definitions(settings: TestSettings, **changes: Any) -> PipelineDefinitions:
    """The test's demo pipeline (``demo_platform.demo_pipeline``) as Dagster definitions."""
    return pipeline_definitions(
        with_start_date(demo_pipeline(settings, **changes), settings), settings
    )


def incremental_job_of(built: PipelineDefinitions, settings: Settings) -> JobDefinition:
    """``<pipeline>_incremental`` ready to run in process: an unpartitioned pipeline's is an
    asset job, resolved here as the code location resolves it (with the test's resource)."""
    job = built.incremental_job
    if isinstance(job, JobDefinition):
        return job
    from sluice_resource import resource_for

    definitions = Definitions(
        assets=[built.output],
        asset_checks=built.checks,
        jobs=[job],
        resources={"sluice": resource_for(settings)},
    )
    return definitions.resolve_job_def(job.name)


def sensor_named(built: PipelineDefinitions, suffix: str) -> SensorDefinition:
    """The pipeline's sensor ``<pipeline>_<suffix>`` (``new_files`` or ``continuous``)."""
    (sensor,) = [s for s in built.sensors if s.name == f"{built.pipeline.name}_{suffix}"]
    return sensor


def schedule_of(built: PipelineDefinitions) -> ScheduleDefinition:
    (schedule,) = built.schedules
    return schedule


def sensor_tick(
    sensor: SensorDefinition,
    sluice: SluiceResource,
    cursor: str | None = None,
    instance: DagsterInstance | None = None,
) -> tuple[Any, str | None]:
    """One evaluation of a sensor: its result and its cursor afterwards.

    The context is opened as a context manager: SluiceResource has nested resources.
    """
    with build_sensor_context(
        instance=instance, cursor=cursor, resources={"sluice": sluice}
    ) as context:
        return sensor(context), context.cursor


def split_counts(settings: Settings, source: str) -> dict[str, int]:
    assert settings.database_url is not None
    engine = connect_engine(settings.database_url.get_secret_value())
    try:
        return SplitStore(engine).counts(source)
    finally:
        engine.dispose()


def step_output(result: ExecuteInProcessResult) -> dict[str, Any]:
    """The metadata of the one op output of a job run (incremental or continuous)."""
    (metadata,) = [
        event.event_specific_data.metadata
        for event in result.all_events
        if event.event_type_value == "STEP_OUTPUT"
    ]
    return {key: value.value for key, value in metadata.items()}


def parquet_files(folder: Path) -> list[Path]:
    """Data files of a table folder, all partitions (hidden and ``_`` files are not data)."""
    return sorted(
        path
        for path in folder.rglob("*.parquet")
        if not any(part.startswith((".", "_")) for part in path.relative_to(folder).parts)
    )


def parquet_rows(folder: Path) -> int:
    return sum(pq.read_metadata(path).num_rows for path in parquet_files(folder))
