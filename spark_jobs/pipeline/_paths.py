"""The roots a pipeline's connectors build on: the warehouse (``SLUICE_WAREHOUSE_DIR``, a
local folder or an object-store URI), and how its source's splits are discovered.

Each connector keeps its own paths in its folder (the files source's landing in
``spark_jobs.connectors.files``, the Parquet sink's table and staging folders in
``spark_jobs.connectors.parquet``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from enumerator_service import (
    Discovery,
    Location,
    Settings,
    StorageOptions,
    open_location,
)
from spark_jobs.connectors._registry import source_connector_named

if TYPE_CHECKING:
    from spark_jobs.pipeline._definition import Pipeline

__all__ = ["discovery_of", "warehouse_root"]


def warehouse_root(settings: Settings) -> Location:
    """``SLUICE_WAREHOUSE_DIR`` (default ``<data>/warehouse``): a local folder or a URI."""
    return open_location(
        settings.warehouse_uri, StorageOptions.of(settings), what="SLUICE_WAREHOUSE_DIR"
    )


def discovery_of(pipeline: Pipeline, settings: Settings) -> Discovery:
    """How the enumerator finds the pipeline's splits (its source connector says)."""
    return source_connector_named(pipeline.plan.source.kind).discovery(pipeline, settings)
