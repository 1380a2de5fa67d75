"""The Dagster resource that turns run configuration into Sluice :class:`Settings`."""

from __future__ import annotations

from typing import Any

from dagster import ConfigurableResource

from enumerator_service import Settings, load_settings

__all__ = ["SluiceResource"]


class SluiceResource(ConfigurableResource["SluiceResource"]):
    """Optional overrides of :class:`Settings`; ``None`` keeps the ``SLUICE_*`` env / default.

    Pass the database URL as ``dagster.EnvVar("SLUICE_DATABASE_URL")`` (or leave it unset) so
    the password never appears in the Dagster UI's resource configuration.
    """

    database_url: str | None = None
    home: str | None = None
    data_dir: str | None = None
    landing_dir: str | None = None
    warehouse_dir: str | None = None
    spark_master: str | None = None
    parallelism: int | None = None
    source_name: str | None = None
    lookup_schema: str | None = None
    lookup_table: str | None = None
    lookup_key: str | None = None
    lookup_capacity: int | None = None
    lookup_batch_size: int | None = None
    lookup_pool_size: int | None = None
    lease_seconds: float | None = None
    max_line_bytes: int | None = None
    log_level: str | None = None

    def overrides(self) -> dict[str, Any]:
        """The configured (non-None) fields, by Settings field name."""
        fields = type(self).model_fields
        values = {name: getattr(self, name) for name in fields}
        return {name: value for name, value in values.items() if value is not None}

    def settings(self) -> Settings:
        """Settings from the environment plus this resource's overrides; ConfigError if invalid."""
        return load_settings(**self.overrides())
