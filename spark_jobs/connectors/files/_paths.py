"""Where a files source's files land: a local folder or a prefix on an object store.

``FileSource(landing=...)``: a relative folder is under ``SLUICE_DATA_DIR`` (no ``..``), an
absolute one is used as given, a URI (``file://``, ``s3://bucket/prefix``, ``gs://``,
``abfs://``, ``hdfs://``) is opened with the settings' :class:`StorageOptions`; the default is
``<SLUICE_DATA_DIR>/landing/<pipeline name>``. A local path is built with
:func:`~enumerator_service.child_path` / :func:`~enumerator_service.relative_under`, which
prove it stays under its root.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from enumerator_service import (
    ConfigError,
    Location,
    Settings,
    StorageOptions,
    child_path,
    open_location,
    relative_under,
)

if TYPE_CHECKING:
    from spark_jobs.pipeline._definition import Pipeline

__all__ = ["landing_location", "landing_path"]


def landing_location(pipeline: Pipeline, settings: Settings) -> Location:
    """Where the files land: a local folder or a prefix on an object store (reached with the
    settings' :class:`StorageOptions`; credentials from the standard chain)."""
    given = pipeline.plan.source.options.landing
    what = f"pipeline {pipeline.name}: source landing"
    options = StorageOptions.of(settings)
    if isinstance(given, str):
        return open_location(given, options, what=what)
    return open_location(landing_path(pipeline, settings), options, what=what)


def landing_path(pipeline: Pipeline, settings: Settings) -> Path:
    """The local landing folder (``<data>/landing/<name>`` by default); ConfigError for a
    landing on an object store (use :func:`landing_location`)."""
    given = pipeline.plan.source.options.landing
    what = f"pipeline {pipeline.name}: source landing"
    if given is None:
        return child_path(settings.data_path, "landing", pipeline.name, what=what, resolve=False)
    if isinstance(given, str):
        location = open_location(given, StorageOptions.of(settings), what=what)
        if location.object_store:
            raise ConfigError(what, f"{location.uri} is not a local folder")
        return location.local_path
    return given if given.is_absolute() else relative_under(settings.data_path, given, what)
