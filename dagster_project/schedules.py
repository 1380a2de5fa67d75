"""A pipeline's schedule of incremental ("available now") runs."""

from dagster import DefaultScheduleStatus, ScheduleDefinition

from dagster_project.jobs import IncrementalJob
from spark_jobs.pipeline import Pipeline

__all__ = ["incremental_schedule"]


def incremental_schedule(pipeline: Pipeline, job: IncrementalJob) -> ScheduleDefinition:
    """``<pipeline>_schedule`` (stopped by default): the pipeline's ``schedule`` (cron, UTC)."""
    return ScheduleDefinition(
        name=f"{pipeline.name}_schedule",
        job=job,
        cron_schedule=pipeline.schedule,
        execution_timezone="UTC",
        default_status=DefaultScheduleStatus.STOPPED,
        description=f"On {pipeline.schedule!r} (UTC): discover new input of pipeline "
        f"{pipeline.name} and process every unassigned split.",
    )
