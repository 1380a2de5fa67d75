"""Dagster resources that turn run configuration into Sluice ``Settings``.

Every field is optional: ``None`` keeps the ``SLUICE_*`` environment variable or the default,
read when ``SluiceResource.settings`` is called (at run time, never at import time). The
production definitions pass ``dagster.EnvVar`` values, so the Dagster UI shows the name of
the variable, never its value (the database password in particular).
"""

from __future__ import annotations

from typing import Any

from dagster import ConfigurableResource, InitResourceContext
from pydantic import Field

from enumerator_service import ConfigError, Settings, load_settings, redact_url, sweep_secret_files

__all__ = ["DatabaseResource", "PathsResource", "SluiceResource", "SparkResource"]


def _set(values: dict[str, Any]) -> dict[str, Any]:
    return {name: value for name, value in values.items() if value is not None}


class DatabaseResource(ConfigurableResource["DatabaseResource"]):
    """The platform database (``sluice`` schema, and the tables pipelines read and write)."""

    url: str | None = Field(
        default=None,
        description="Postgres URL (SLUICE_DATABASE_URL). Unset: embedded PostgreSQL. "
        'Pass dagster.EnvVar("SLUICE_DATABASE_URL") so the password stays out of the UI.',
    )

    def overrides(self) -> dict[str, Any]:
        return _set({"database_url": self.url})

    def __repr_args__(self) -> Any:
        # repr() and str() (and so the nested SluiceResource's) show the URL redacted.
        for name, value in super().__repr_args__():
            yield name, redact_url(value) if name == "url" and isinstance(value, str) else value


class SparkResource(ConfigurableResource["SparkResource"]):
    """Where and how wide the reader job runs."""

    master: str | None = Field(default=None, description="Spark master URL (SLUICE_SPARK_MASTER).")
    parallelism: int | None = Field(
        default=None, description="Reader subtasks per run (SLUICE_PARALLELISM)."
    )
    driver_host: str | None = Field(
        default=None,
        description="Address executors use to reach the driver (SLUICE_SPARK_DRIVER_HOST).",
    )

    def overrides(self) -> dict[str, Any]:
        return _set(
            {
                "spark_master": self.master,
                "parallelism": self.parallelism,
                "spark_driver_host": self.driver_host,
            }
        )


class PathsResource(ConfigurableResource["PathsResource"]):
    """State, data and warehouse folders (a pipeline's landing folder is its definition's:
    ``<data_dir>/landing/<pipeline>`` unless it names one)."""

    home: str | None = Field(default=None, description="State folder (SLUICE_HOME).")
    data_dir: str | None = Field(default=None, description="Data root (SLUICE_DATA_DIR).")
    warehouse_dir: str | None = Field(
        default=None, description="Output root (SLUICE_WAREHOUSE_DIR)."
    )

    def overrides(self) -> dict[str, Any]:
        return _set(
            {
                "home": self.home,
                "data_dir": self.data_dir,
                "warehouse_dir": self.warehouse_dir,
            }
        )


#: SluiceResource fields that are not Settings fields.
_NOT_SETTINGS = frozenset({"database", "spark", "paths"})


class SluiceResource(ConfigurableResource["SluiceResource"]):
    """Optional overrides of ``Settings``; ``None`` keeps the ``SLUICE_*`` env / default.

    Database, Spark and paths are nested resources (``None``: all from the environment); the
    remaining fields override the Settings field of the same name.
    """

    database: DatabaseResource | None = None
    spark: SparkResource | None = None
    paths: PathsResource | None = None
    lookup_capacity: int | None = None
    lookup_batch_size: int | None = None
    lookup_pool_size: int | None = None
    lease_seconds: float | None = None
    max_line_bytes: int | None = None
    discovery_max_files_per_tick: int | None = None
    log_level: str | None = None
    max_dead_letter_ratio: float | None = Field(
        default=None,
        ge=0.0,
        le=1.0,
        description="A pipeline's dead-letter check fails above this share of a partition's "
        "records (default: the setting SLUICE_MAX_DEAD_LETTER_RATIO, 0.05).",
    )

    def overrides(self) -> dict[str, Any]:
        """The configured (non-None) fields, by Settings field name."""
        values: dict[str, Any] = {
            name: getattr(self, name)
            for name in type(self).model_fields
            if name not in _NOT_SETTINGS
        }
        for part in (self.database, self.spark, self.paths):
            if part is not None:
                values.update(part.overrides())
        return _set(values)

    def settings(self) -> Settings:
        """Settings from the environment plus this resource's overrides; ConfigError if invalid."""
        return load_settings(**self.overrides())

    def setup_for_execution(self, context: InitResourceContext) -> None:
        """At each run's (and sensor tick's) start: remove the password files of killed
        drivers. Invalid settings are reported where they are used, not here."""
        try:
            home = self.settings().home_path
        except ConfigError:
            return
        sweep_secret_files(home)
