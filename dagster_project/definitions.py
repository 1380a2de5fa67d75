"""The Sluice code location: ``dagster dev -m dagster_project.definitions``.

``DAGSTER_DEPLOYMENT`` (``local``, the default, or ``production``) picks the resources when the
code location loads (not when this module is imported). Local resources leave every setting
to the ``SLUICE_*`` environment and the defaults; production ones name the environment
variables the deployment must set, so the UI shows variable names, never their values.
"""

import os
from collections.abc import Callable
from typing import Any

from dagster import Definitions, EnvVar, definitions

from dagster_project.assets import daily_revenue_by_country, enriched_events
from dagster_project.checks import enriched_events_checks
from dagster_project.continuous import (
    continuous_reader_job,
    continuous_reader_sensor,
    release_failed_run_splits,
)
from dagster_project.jobs import process_new_splits_job
from dagster_project.observations import raw_events, users
from dagster_project.resources import (
    DatabaseResource,
    PathsResource,
    SluiceResource,
    SparkResource,
)
from dagster_project.schedules import hourly_incremental_schedule
from dagster_project.sensors import new_files_sensor

__all__ = ["DEPLOYMENTS", "defs", "local_resources", "production_resources"]


def _resources(
    database: DatabaseResource, spark: SparkResource, paths: PathsResource
) -> dict[str, Any]:
    # The parts are top-level resources too, so the UI lists each with its configuration.
    return {
        "sluice": SluiceResource(database=database, spark=spark, paths=paths),
        "database": database,
        "spark": spark,
        "paths": paths,
    }


def local_resources() -> dict[str, Any]:
    """Everything from ``SLUICE_*`` / defaults (embedded Postgres, ``local[*]`` Spark, ./data)."""
    return _resources(DatabaseResource(), SparkResource(), PathsResource())


def production_resources() -> dict[str, Any]:
    """Database, Spark master and data folder from required environment variables."""
    return _resources(
        DatabaseResource(url=EnvVar("SLUICE_DATABASE_URL")),
        SparkResource(master=EnvVar("SLUICE_SPARK_MASTER")),
        PathsResource(data_dir=EnvVar("SLUICE_DATA_DIR")),
    )


DEPLOYMENTS: dict[str, Callable[[], dict[str, Any]]] = {
    "local": local_resources,
    "production": production_resources,
}


@definitions
def defs() -> Definitions:
    deployment = os.environ.get("DAGSTER_DEPLOYMENT", "local")
    if deployment not in DEPLOYMENTS:
        raise ValueError(
            f"DAGSTER_DEPLOYMENT: {deployment!r} is not one of {', '.join(sorted(DEPLOYMENTS))}"
        )
    return Definitions(
        assets=[raw_events, users, enriched_events, daily_revenue_by_country],
        asset_checks=enriched_events_checks,
        jobs=[process_new_splits_job, continuous_reader_job],
        sensors=[new_files_sensor, continuous_reader_sensor, release_failed_run_splits],
        schedules=[hourly_incremental_schedule],
        resources=DEPLOYMENTS[deployment](),
    )
