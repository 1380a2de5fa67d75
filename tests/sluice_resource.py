"""The Dagster resource that reproduces a test's Settings (the fields the tests vary)."""

from __future__ import annotations

from typing import Any

from dagster_project.resources import DatabaseResource, PathsResource, SluiceResource, SparkResource
from enumerator_service import Settings


def resource_for(settings: Settings, **fields: Any) -> SluiceResource:
    """A resource that reproduces ``settings`` (database, paths and Spark), plus ``fields``.

    Which pipeline a definition runs is the definition's own business (its name, landing
    folder and sink); settings the resource has no field for come from ``SLUICE_*`` (tests
    set them with ``monkeypatch.setenv``).
    """
    assert settings.database_url is not None
    return SluiceResource(
        database=DatabaseResource(url=settings.database_url.get_secret_value()),
        paths=PathsResource(
            home=str(settings.home),
            data_dir=str(settings.data_dir),
            warehouse_dir=None if settings.warehouse_dir is None else str(settings.warehouse_dir),
        ),
        spark=SparkResource(master=settings.spark_master, parallelism=settings.parallelism),
        **fields,
    )
