"""Where a pipeline's files are: landing folder, output table folder, staging folder.

Every folder is under the configured data or warehouse root unless the definition itself
gives an absolute landing folder; the names that become path parts (pipeline and table
names) are validated identifiers, a relative landing folder has no ``..``, and each path is
built with :func:`child_path` / :func:`relative_under`, which prove it resolves under its
root, so nothing from outside escapes it.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from enumerator_service import Discovery, Settings, child_path, relative_under
from spark_jobs.connectors._registry import source_connector_named

if TYPE_CHECKING:
    from spark_jobs.pipeline._definition import Pipeline

__all__ = ["discovery_of", "landing_path", "output_path", "staging_path"]


def landing_path(pipeline: Pipeline, settings: Settings) -> Path:
    """The landing folder of a file source (``<data>/landing/<name>`` by default)."""
    given = pipeline.plan.source.options.landing
    what = f"pipeline {pipeline.name}: source landing"
    if given is None:
        return child_path(settings.data_path, "landing", pipeline.name, what=what, resolve=False)
    return given if given.is_absolute() else relative_under(settings.data_path, given, what)


def output_path(pipeline: Pipeline, settings: Settings) -> Path:
    """The Parquet table folder (``<warehouse>/<table>``); for a Postgres sink, where its
    staging files would be (unused)."""
    folder = getattr(pipeline.plan.sink.options, "folder", None) or pipeline.name
    return child_path(settings.warehouse_path, folder, what=f"pipeline {pipeline.name}: sink")


def staging_path(pipeline: Pipeline, settings: Settings) -> Path:
    """Staged (uncommitted) files, outside the table folder so no reader ever sees them."""
    folder = getattr(pipeline.plan.sink.options, "folder", None) or pipeline.name
    staging = settings.warehouse_path / "_staging"
    return child_path(staging, folder, what=f"pipeline {pipeline.name}: sink")


def discovery_of(pipeline: Pipeline, settings: Settings) -> Discovery:
    """How the enumerator finds the pipeline's splits (its source connector says)."""
    return source_connector_named(pipeline.plan.source.kind).discovery(pipeline, settings)
