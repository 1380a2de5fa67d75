"""The Sluice code location: ``dagster dev -m dagster_project.definitions``.

Built when the code location loads (never at import): every pipeline registered with
``SLUICE_PIPELINES`` becomes its assets, checks, jobs, sensors and schedule
(``_factory.pipeline_definitions``).

``DAGSTER_DEPLOYMENT`` (``local``, the default, or ``production``) picks the resources when the
code location loads (not when this module is imported). Local resources leave every setting
to the ``SLUICE_*`` environment and the defaults; production ones name the environment
variables the deployment must set, so the UI shows variable names, never their values.
"""

import importlib
import os
from collections.abc import Callable
from typing import Any

from dagster import (
    AssetKey,
    AssetsDefinition,
    AutomationConditionSensorDefinition,
    DefaultSensorStatus,
    Definitions,
    EnvVar,
    definitions,
)

from dagster_project._factory import pipeline_definitions
from dagster_project.continuous import release_failed_run_splits
from dagster_project.resources import (
    DatabaseResource,
    PathsResource,
    SluiceResource,
    SparkResource,
)
from enumerator_service import load_settings
from spark_jobs.pipeline import load_pipelines

__all__ = [
    "AUTOMATION_SENSOR",
    "DEPLOYMENTS",
    "defs",
    "local_resources",
    "pipelines_definitions",
    "production_resources",
]


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


#: The sensor evaluating the automation conditions of the code location's assets.
AUTOMATION_SENSOR = "sluice_automation"


def automation_sensor(assets: list[Any]) -> AutomationConditionSensorDefinition | None:
    """The ``AutomationConditionSensorDefinition`` of the assets that have an
    ``automation_condition`` (those a module's ``dagster_assets()`` adds: the pipelines'
    own assets have none), running by default; None when no asset has one.

    Declared here rather than left to Dagster's implicit default sensor so that it is
    running from the first deployment and its interval is ours; it evaluates in the daemon
    (``use_user_code_server=False``, Dagster's default) and reads only the event log.
    """
    keys: list[AssetKey] = [
        key
        for definition in assets
        if isinstance(definition, AssetsDefinition)
        for key, condition in definition.automation_conditions_by_key.items()
        if condition is not None
    ]
    if not keys:
        return None
    return AutomationConditionSensorDefinition(
        AUTOMATION_SENSOR,
        target=keys,
        default_status=DefaultSensorStatus.RUNNING,
        minimum_interval_seconds=30,
        description="Requests the runs the automation conditions of these assets ask for "
        "(e.g. daily_revenue_by_country when its upstream day completes).",
    )


DEPLOYMENTS: dict[str, Callable[[], dict[str, Any]]] = {
    "local": local_resources,
    "production": production_resources,
}


def pipelines_definitions(resources: dict[str, Any]) -> Definitions:
    """Assets, checks, jobs, sensors and schedules of every registered pipeline
    (``SLUICE_PIPELINES``), the assets their modules add (a module-level ``dagster_assets()``
    returning a list), the failed-run sensor and, when one of those assets has an
    ``automation_condition``, the sensor evaluating it (``automation_sensor``)."""
    settings = load_settings()
    pipelines = load_pipelines(settings)
    assets: dict[Any, AssetsDefinition] = {}
    checks, jobs, sensors, schedules = [], [], [release_failed_run_splits], []
    for pipeline in pipelines.values():
        built = pipeline_definitions(pipeline, settings)
        for definition in [*built.source_assets, built.output]:
            for key in definition.keys:
                assets.setdefault(key, definition)  # a table several pipelines read: once
        checks += [*built.checks, built.freshness]
        jobs += built.jobs
        sensors += built.sensors
        schedules += built.schedules
    extra: list[Any] = []
    for name in settings.pipeline_modules:
        hook = getattr(importlib.import_module(name), "dagster_assets", None)
        if callable(hook):
            extra += hook()
    unique = list(dict.fromkeys(assets.values()))
    automation = automation_sensor([*unique, *extra])
    if automation is not None:
        sensors.append(automation)
    return Definitions(
        assets=[*unique, *extra],
        asset_checks=checks,
        jobs=jobs,
        sensors=sensors,
        schedules=schedules,
        resources=resources,
    )


@definitions
def defs() -> Definitions:
    deployment = os.environ.get("DAGSTER_DEPLOYMENT", "local")
    if deployment not in DEPLOYMENTS:
        raise ValueError(
            f"DAGSTER_DEPLOYMENT: {deployment!r} is not one of {', '.join(sorted(DEPLOYMENTS))}"
        )
    return pipelines_definitions(DEPLOYMENTS[deployment]())
