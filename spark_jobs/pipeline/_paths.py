"""Where a pipeline's files are: landing folder, output table folder, staging folder.

Every folder is under the configured data or warehouse root unless the definition itself
gives an absolute landing folder; the names that become path parts (pipeline and table
names) are validated identifiers, so nothing from outside escapes its root.
"""

from __future__ import annotations

from pathlib import Path

from enumerator_service import Settings
from enumerator_service._operations import Discovery, FileDiscovery, TableDiscovery
from spark_jobs.pipeline._definition import Pipeline

__all__ = ["discovery_of", "landing_path", "output_path", "staging_path"]


def landing_path(pipeline: Pipeline, settings: Settings) -> Path:
    """The landing folder of a file source (``<data>/landing/<name>`` by default)."""
    given = pipeline.plan.source.landing
    if given is None:
        return settings.data_path / "landing" / pipeline.name
    return given if given.is_absolute() else settings.data_path / given


def output_path(pipeline: Pipeline, settings: Settings) -> Path:
    """The Parquet table folder (``<warehouse>/<table>``); for a Postgres sink, where its
    staging files would be (unused)."""
    return settings.warehouse_path / (pipeline.plan.sink.folder or pipeline.name)


def staging_path(pipeline: Pipeline, settings: Settings) -> Path:
    """Staged (uncommitted) files, outside the table folder so no reader ever sees them."""
    return settings.warehouse_path / "_staging" / (pipeline.plan.sink.folder or pipeline.name)


def discovery_of(pipeline: Pipeline, settings: Settings) -> Discovery:
    """How the enumerator finds the pipeline's splits."""
    source = pipeline.plan.source
    if source.kind == "table":
        assert source.table is not None and source.key is not None
        return TableDiscovery(
            pipeline.name, source.table[0], source.table[1], source.key, source.rows_per_split
        )
    return FileDiscovery(pipeline.name, landing_path(pipeline, settings), source.partitioned)
