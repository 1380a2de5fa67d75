"""The hourly incremental schedule (bounded "available now" runs)."""

from dagster import DefaultScheduleStatus, ScheduleDefinition

from dagster_project.jobs import process_new_splits_job

__all__ = ["hourly_incremental_schedule"]

hourly_incremental_schedule = ScheduleDefinition(
    name="hourly_incremental_schedule",
    job=process_new_splits_job,
    cron_schedule="0 * * * *",
    execution_timezone="UTC",
    default_status=DefaultScheduleStatus.STOPPED,
    description="Every hour: discover new landing files and enrich every unassigned split.",
)
