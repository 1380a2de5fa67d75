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

from pathlib import Path
from typing import TYPE_CHECKING

from enumerator_service import (
    Discovery,
    Location,
    Settings,
    StorageOptions,
    child_path,
    open_location,
    relative_under,
)
from spark_jobs.connectors._registry import source_connector_named

if TYPE_CHECKING:
    from spark_jobs.pipeline._definition import Pipeline

__all__ = ["discovery_of", "landing_path", "warehouse_root"]


def landing_path(pipeline: Pipeline, settings: Settings) -> Path:
    """The landing folder of a file source (``<data>/landing/<name>`` by default)."""
    given = pipeline.plan.source.options.landing
    what = f"pipeline {pipeline.name}: source landing"
    if given is None:
        return child_path(settings.data_path, "landing", pipeline.name, what=what, resolve=False)
    return given if given.is_absolute() else relative_under(settings.data_path, given, what)


def warehouse_root(settings: Settings) -> Location:
    """``SLUICE_WAREHOUSE_DIR`` (default ``<data>/warehouse``): a local folder or a URI."""
    return open_location(
        settings.warehouse_uri, StorageOptions.of(settings), what="SLUICE_WAREHOUSE_DIR"
    )


def discovery_of(pipeline: Pipeline, settings: Settings) -> Discovery:
    """How the enumerator finds the pipeline's splits (its source connector says)."""
    return source_connector_named(pipeline.plan.source.kind).discovery(pipeline, settings)
