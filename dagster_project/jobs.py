"""The incremental job: discover new files, then process everything unassigned."""

from dagster import Nothing, OpExecutionContext, Out, Output, job, op

from dagster_project._pipeline import (
    describe,
    discover_and_enrich,
    sluice_run_id,
    summary_metadata,
)
from dagster_project.resources import SluiceResource

__all__ = ["process_new_splits", "process_new_splits_job"]


@op(out=Out(Nothing))
def process_new_splits(context: OpExecutionContext, sluice: SluiceResource) -> Output[None]:
    """One continuous-cursor discovery tick, then one bounded reader run ("available now")."""
    settings = sluice.settings()
    discovery, summary = discover_and_enrich(settings, run_id=sluice_run_id(context.run))
    context.log.info(
        f"discovery: {discovery.files_seen} files seen, "
        f"{discovery.splits_registered} new splits; {describe(summary)}"
    )
    return Output(None, metadata=summary_metadata(discovery, summary, settings.output_path))


@job(description="Discover new landing files and enrich every unassigned split.")
def process_new_splits_job() -> None:
    process_new_splits()
