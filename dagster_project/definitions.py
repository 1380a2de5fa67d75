"""The Sluice code location: ``dagster dev -m dagster_project.definitions``."""

from dagster import Definitions

from dagster_project.assets import enriched_events
from dagster_project.jobs import process_new_splits_job
from dagster_project.resources import SluiceResource
from dagster_project.schedules import hourly_incremental_schedule
from dagster_project.sensors import new_files_sensor

defs = Definitions(
    assets=[enriched_events],
    jobs=[process_new_splits_job],
    sensors=[new_files_sensor],
    schedules=[hourly_incremental_schedule],
    resources={"sluice": SluiceResource()},
)
