"""Reading a pipeline's Iceberg table from outside its runs: a downstream reader (a Dagster
asset, a report) loads the table its ``IcebergSink`` commits to, then scans it by snapshot.

Threading: every call opens and disposes its own database engine; the returned PyIceberg
``Table`` holds no connection (its scans read the metadata and data files through its FileIO),
so it may be used from any one thread after the call returns.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from enumerator_service import ConfigError, Settings, StorageOptions
from spark_jobs.connectors.iceberg._catalog import catalog_engine, default_warehouse, open_catalog
from spark_jobs.connectors.iceberg._commit import SINK_NAME

if TYPE_CHECKING:
    from pyiceberg.table import Table

    from spark_jobs.pipeline._definition import Pipeline

__all__ = ["sink_table", "sink_table_name"]


def sink_table_name(pipeline: Pipeline) -> str:
    """``namespace.name`` of the table ``pipeline``'s ``IcebergSink`` writes; ConfigError in
    one line when its sink is another one."""
    sink = pipeline.plan.sink
    if sink.kind != SINK_NAME:
        raise ConfigError(
            f"pipeline {pipeline.name}: sink", f"is {sink.kind}, not an IcebergSink table"
        )
    table: str = sink.options.table
    return table


def sink_table(pipeline: Pipeline, settings: Settings) -> Table:
    """The table ``pipeline``'s ``IcebergSink`` writes, its metadata as the catalog has it now.

    A table that does not exist yet (no run of the pipeline committed anything) is an error,
    one line naming the sink's table: a reader must not take it for an empty table.
    """
    from pyiceberg.exceptions import NoSuchTableError

    name = sink_table_name(pipeline)
    catalog_name = pipeline.plan.sink.options.catalog
    engine = catalog_engine(settings)
    try:
        warehouse = None if catalog_name else default_warehouse(settings)
        catalog = open_catalog(
            engine,
            catalog_name,
            StorageOptions.of(settings),
            warehouse,
            what=f"pipeline {pipeline.name}: IcebergSink(catalog)",
        )
        try:
            return catalog.load_table(name)
        except NoSuchTableError:
            raise ConfigError(
                f"pipeline {pipeline.name}: IcebergSink(table)",
                f"{name} does not exist yet (no run of the pipeline has committed to it)",
            ) from None
    finally:
        engine.dispose()
