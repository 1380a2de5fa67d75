"""Where a pipeline's files are: landing folder, output table folder, staging folder.

Every folder is under the configured data or warehouse root unless the definition itself
gives an absolute landing folder or a landing URI (``s3://bucket/prefix``:
:func:`landing_location`); the names that become path parts (pipeline and table
names) are validated identifiers, a relative landing folder has no ``..``, and each path is
built with :func:`child_path` / :func:`relative_under`, which prove it resolves under its
root, so nothing from outside escapes it.
"""

from __future__ import annotations

from pathlib import Path

from enumerator_service import ConfigError, Settings
from enumerator_service._operations import Discovery, FileDiscovery, TableDiscovery
from enumerator_service._safe_paths import child_path, relative_under
from enumerator_service._storage import Location, StorageOptions, open_location
from spark_jobs.pipeline._definition import Pipeline

__all__ = ["discovery_of", "landing_location", "landing_path", "output_path", "staging_path"]


def landing_location(pipeline: Pipeline, settings: Settings) -> Location:
    """Where a file source's files land: a local folder (``<data>/landing/<name>`` by
    default, a relative one under the data folder) or a prefix on an object store (a
    ``s3://…`` URI, reached with the settings' :class:`StorageOptions`)."""
    given = pipeline.plan.source.landing
    what = f"pipeline {pipeline.name}: source landing"
    options = StorageOptions.of(settings)
    if isinstance(given, str):
        return open_location(given, options, what=what)
    return open_location(landing_path(pipeline, settings), options, what=what)


def landing_path(pipeline: Pipeline, settings: Settings) -> Path:
    """The local landing folder of a file source (``<data>/landing/<name>`` by default);
    ConfigError for a landing on an object store (use :func:`landing_location`)."""
    given = pipeline.plan.source.landing
    what = f"pipeline {pipeline.name}: source landing"
    if given is None:
        return child_path(settings.data_path, "landing", pipeline.name, what=what, resolve=False)
    if isinstance(given, str):
        location = open_location(given, StorageOptions.of(settings), what=what)
        if location.object_store:
            raise ConfigError(what, f"{location.uri} is not a local folder")
        return location.local_path
    return given if given.is_absolute() else relative_under(settings.data_path, given, what)


def output_path(pipeline: Pipeline, settings: Settings) -> Path:
    """The Parquet table folder (``<warehouse>/<table>``); for a Postgres sink, where its
    staging files would be (unused)."""
    folder = pipeline.plan.sink.folder or pipeline.name
    return child_path(settings.warehouse_path, folder, what=f"pipeline {pipeline.name}: sink")


def staging_path(pipeline: Pipeline, settings: Settings) -> Path:
    """Staged (uncommitted) files, outside the table folder so no reader ever sees them."""
    folder = pipeline.plan.sink.folder or pipeline.name
    staging = settings.warehouse_path / "_staging"
    return child_path(staging, folder, what=f"pipeline {pipeline.name}: sink")


def discovery_of(pipeline: Pipeline, settings: Settings) -> Discovery:
    """How the enumerator finds the pipeline's splits."""
    source = pipeline.plan.source
    if source.kind == "table":
        assert source.table is not None and source.key is not None
        return TableDiscovery(
            pipeline.name, source.table[0], source.table[1], source.key, source.rows_per_split
        )
    landing = landing_location(pipeline, settings)
    where = landing if landing.object_store else landing.local_path
    return FileDiscovery(pipeline.name, where, source.partitioned)
