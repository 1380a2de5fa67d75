"""The incremental job: discover new files, then process everything unassigned."""

import dataclasses

from dagster import Nothing, OpExecutionContext, Out, Output, job, op

from dagster_project._pipeline import (
    describe,
    discover_and_enrich,
    discover_once,
    sluice_run_id,
    summary_metadata,
)
from dagster_project.resources import SluiceResource
from enumerator_service import Settings


def drain_discovery(settings: Settings) -> int:
    """Capped discovery ticks until no backlog is left; the splits they registered.

    The per-tick cap keeps a *sensor tick* short; a run has no such limit and processes
    "everything discovered", so it first registers the whole backlog, one committed chunk
    after another.
    """
    registered = 0
    while True:
        tick = discover_once(settings)
        registered += tick.splits_registered
        if tick.complete:
            return registered


__all__ = ["process_new_splits", "process_new_splits_job"]


@op(out=Out(Nothing))
def process_new_splits(context: OpExecutionContext, sluice: SluiceResource) -> Output[None]:
    """Continuous-cursor discovery (every chunk of a backlog), then one bounded reader run
    ("available now")."""
    settings = sluice.settings()
    drained = drain_discovery(settings)
    discovery, summary = discover_and_enrich(settings, run_id=sluice_run_id(context.run))
    discovery = dataclasses.replace(
        discovery, splits_registered=drained + discovery.splits_registered
    )
    context.log.info(
        f"discovery: {discovery.files_seen} files seen, "
        f"{discovery.splits_registered} new splits; {describe(summary)}"
    )
    return Output(None, metadata=summary_metadata(discovery, summary, settings.output_path))


@job(description="Discover new landing files and enrich every unassigned split.")
def process_new_splits_job() -> None:
    process_new_splits()
