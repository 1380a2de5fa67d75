"""The Dagster resource that reproduces a test's Settings (the fields the tests vary)."""

from __future__ import annotations

from typing import Any

from dagster_project.resources import DatabaseResource, PathsResource, SluiceResource, SparkResource
from enumerator_service import Settings


def resource_for(settings: Settings, **fields: Any) -> SluiceResource:
    """A resource that reproduces ``settings`` (database, paths, Spark, source and lookup
    table), plus ``fields``."""
    assert settings.database_url is not None
    return SluiceResource(
        database=DatabaseResource(url=settings.database_url.get_secret_value()),
        paths=PathsResource(home=str(settings.home), data_dir=str(settings.data_dir)),
        spark=SparkResource(master=settings.spark_master, parallelism=settings.parallelism),
        source_name=settings.source_name,
        lookup_table=settings.lookup_table,
        **fields,
    )
