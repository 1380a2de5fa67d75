"""Where a Parquet sink's files are: its table folder and, next to it, its staging folder.

``ParquetSink(path=...)`` if given (a URI, an absolute folder, or a folder relative to the
warehouse root), else ``<SLUICE_WAREHOUSE_DIR>/<table>``: a local folder or an object-store
prefix (a :class:`~enumerator_service.Location`). Names that become path parts are validated
identifiers; a relative path has no ``..``; a local path is proven to stay under its root
(:func:`~enumerator_service.child_path`).
"""

from __future__ import annotations

import posixpath
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING

from enumerator_service import (
    ConfigError,
    Location,
    Settings,
    StorageOptions,
    child_path,
    open_location,
)
from spark_jobs.pipeline._paths import warehouse_root

if TYPE_CHECKING:
    from spark_jobs.connectors.parquet._connector import ParquetOptions
    from spark_jobs.pipeline._definition import Pipeline

__all__ = [
    "STAGING_FOLDER",
    "output_path",
    "output_root",
    "staging_of",
    "staging_path",
    "staging_root",
]

#: The folder next to a table folder that holds its staged (uncommitted) files.
STAGING_FOLDER = "_staging"


def output_root(pipeline: Pipeline, settings: Settings) -> Location:
    """The Parquet table folder: ``ParquetSink(path=...)`` if given (a URI, an absolute
    folder, or a folder relative to the warehouse root), else ``<warehouse>/<table>``; for a
    Postgres sink, where its files would be (unused)."""
    options: ParquetOptions = pipeline.plan.sink.options
    what = f"pipeline {pipeline.name}: sink"
    given = options.path
    if given is not None and ("://" in given or Path(given).is_absolute()):
        location = open_location(given, StorageOptions.of(settings), what=f"{what} path")
    else:
        parts = (
            PurePosixPath(given).parts if given is not None else (options.folder or pipeline.name,)
        )
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
