"""``sluice cdc``: the server-side resources of a change-data-capture source.

A CDC source's replication slot keeps WAL on the source server until it is read and
advanced; a pipeline that is retired (or must take a new snapshot) drops it with
``sluice cdc drop PIPELINE``: the slot and the publication, and the source's splits and
discovery cursor (the next discovery creates both again and takes a new snapshot).
``sluice status`` shows each slot's retained WAL.
"""

from __future__ import annotations

import click

from enumerator_service import Settings, open_platform
from spark_jobs.connectors._interface import SourceConnector
from spark_jobs.connectors._registry import source_connector_named
from spark_jobs.pipeline._registry import load_pipelines, pick_pipeline

__all__ = ["cdc"]


@click.group()
def cdc() -> None:
    """Change-data-capture sources: their replication slots and publications."""


@cdc.command("drop")
@click.argument("pipeline")
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
@click.pass_context
def cdc_drop(ctx: click.Context, pipeline: str, yes: bool) -> None:
    """Drop PIPELINE's replication slot and publication, and forget its progress.

    A run reading the slot is ended. The next discovery creates the slot and the
    publication again and takes a new snapshot of the tables.
    """
    settings = ctx.obj
    assert isinstance(settings, Settings)
    chosen = pick_pipeline(load_pipelines(settings), pipeline)
    connector = source_connector_named(chosen.plan.source.kind)
    if type(connector).release is SourceConnector.release:  # (the default: holds nothing)
        raise click.ClickException(f"pipeline {chosen.name}: its source holds no server resources")
    if not yes:
        click.confirm(
            f"Drop the replication slot and publication of {chosen.name} and forget its"
            " progress (the next discovery takes a new snapshot)?",
            abort=True,
        )
    platform = open_platform(settings, migrate=False)
    try:
        lines = connector.release(platform.engine, chosen.plan) or []
    finally:
        platform.close()
    for line in lines:
        click.echo(line)
