"""Where a pipeline's files are: landing folder, output table folder, staging folder.

The output side is a :class:`~enumerator_service.Location` (``output_root``,
``staging_root``): a local folder or an object-store prefix (``SLUICE_WAREHOUSE_DIR`` or
``ParquetSink(path=...)`` as a URI). Staged files live in ``<parent>/_staging/<name>`` next to
the table folder ``<parent>/<name>`` — for the default ``<warehouse>/<table>`` that is
``<warehouse>/_staging/<table>`` — so staging and table share a file system (a local rename,
an object store's server-side copy) and no reader of the table ever lists a staged file.

Every folder is under the configured data or warehouse root unless the definition itself
gives an absolute landing folder; the names that become path parts (pipeline and table
names) are validated identifiers, a relative landing folder has no ``..``, and each path is
built with :func:`child_path` / :func:`relative_under`, which prove it resolves under its
root, so nothing from outside escapes it.
"""

from __future__ import annotations

import posixpath
from pathlib import Path, PurePosixPath

from enumerator_service import ConfigError, Location, Settings, StorageOptions, open_location
from enumerator_service._operations import Discovery, FileDiscovery, TableDiscovery
from enumerator_service._safe_paths import child_path, relative_under
from spark_jobs.pipeline._definition import Pipeline

__all__ = [
    "STAGING_FOLDER",
    "discovery_of",
    "landing_path",
    "output_path",
    "output_root",
    "staging_path",
    "staging_root",
    "warehouse_root",
]

#: The folder next to a table folder that holds its staged (uncommitted) files.
STAGING_FOLDER = "_staging"


def landing_path(pipeline: Pipeline, settings: Settings) -> Path:
    """The landing folder of a file source (``<data>/landing/<name>`` by default)."""
    given = pipeline.plan.source.landing
    what = f"pipeline {pipeline.name}: source landing"
    if given is None:
        return child_path(settings.data_path, "landing", pipeline.name, what=what, resolve=False)
    return given if given.is_absolute() else relative_under(settings.data_path, given, what)


def warehouse_root(settings: Settings) -> Location:
    """``SLUICE_WAREHOUSE_DIR`` (default ``<data>/warehouse``): a local folder or a URI."""
    return open_location(
        settings.warehouse_uri, StorageOptions.of(settings), what="SLUICE_WAREHOUSE_DIR"
    )


def output_root(pipeline: Pipeline, settings: Settings) -> Location:
    """The Parquet table folder: ``ParquetSink(path=...)`` if given (a URI, an absolute
    folder, or a folder relative to the warehouse root), else ``<warehouse>/<table>``; for a
    Postgres sink, where its files would be (unused)."""
    sink = pipeline.plan.sink
    what = f"pipeline {pipeline.name}: sink"
    given = sink.path
    if given is not None and ("://" in given or Path(given).is_absolute()):
        location = open_location(given, StorageOptions.of(settings), what=f"{what} path")
    else:
        parts = PurePosixPath(given).parts if given is not None else (sink.folder or pipeline.name,)
        if not parts or ".." in parts:
            raise ConfigError(f"{what} path", f"{given!r} is not a folder under the warehouse")
        warehouse = warehouse_root(settings)
        if not warehouse.object_store:
            local = child_path(warehouse.local_path, *parts, what=what)
            return open_location(local, warehouse.options)
        location = warehouse.child(*parts)
    if location.object_store and "/" not in location.path.strip("/"):
        raise ConfigError(
            f"{what} path",
            f"{location.uri}: a table folder needs a prefix below the bucket root",
        )
    return location


def staging_root(pipeline: Pipeline, settings: Settings) -> Location:
    """Staged (uncommitted) files: ``<parent>/_staging/<name>`` next to the table folder
    ``<parent>/<name>``, outside it so no reader ever sees them."""
    return staging_of(output_root(pipeline, settings))


def staging_of(table: Location) -> Location:
    """The staging folder of the table folder ``table``."""
    path = table.path.rstrip("/")
    parent_path, name = posixpath.split(path)
    parent_uri = table.uri.rstrip("/").rsplit("/", 1)[0]
    parent = Location(parent_uri, parent_path, table.options, table.fs)
    return parent.child(STAGING_FOLDER, name)


def output_path(pipeline: Pipeline, settings: Settings) -> Path:
    """:func:`output_root` as a local folder (ConfigError on an object store)."""
    return _local(output_root(pipeline, settings), pipeline)


def staging_path(pipeline: Pipeline, settings: Settings) -> Path:
    """:func:`staging_root` as a local folder (ConfigError on an object store)."""
    return _local(staging_root(pipeline, settings), pipeline)


def _local(location: Location, pipeline: Pipeline) -> Path:
    if location.object_store:
        raise ConfigError(
            f"pipeline {pipeline.name}: sink", f"{location.uri} is not a local folder"
        )
    return location.local_path


def discovery_of(pipeline: Pipeline, settings: Settings) -> Discovery:
    """How the enumerator finds the pipeline's splits."""
    source = pipeline.plan.source
    if source.kind == "table":
        assert source.table is not None and source.key is not None
        return TableDiscovery(
            pipeline.name, source.table[0], source.table[1], source.key, source.rows_per_split
        )
    return FileDiscovery(pipeline.name, landing_path(pipeline, settings), source.partitioned)
