"""A pipeline's incremental job: discover new input, then process everything unassigned."""

import dataclasses

from dagster import JobDefinition, Nothing, OpExecutionContext, Out, Output, job, op

from dagster_project._runs import (
    PIPELINE_TAG,
    describe_run,
    discover_and_run,
    drain_discovery,
    sluice_run_id,
    summary_metadata,
)
from dagster_project.assets import output_location
from dagster_project.resources import SluiceResource
from spark_jobs.pipeline import Pipeline

__all__ = ["incremental_job"]


def incremental_job(pipeline: Pipeline) -> JobDefinition:
    """``<pipeline>_incremental``: continuous-cursor discovery (every chunk of a backlog), then
    one bounded reader run ("available now")."""

    @op(name=f"{pipeline.name}_process_new_splits", out=Out(Nothing))
    def process_new_splits(context: OpExecutionContext, sluice: SluiceResource) -> Output[None]:
        settings = sluice.settings()
        drained = drain_discovery(settings, pipeline)
        discovery, summary = discover_and_run(settings, pipeline, run_id=sluice_run_id(context.run))
        discovery = dataclasses.replace(
            discovery, splits_registered=drained + discovery.splits_registered
        )
        context.log.info(
            f"discovery: {discovery.files_seen} seen, {discovery.splits_registered} new splits; "
            f"{describe_run(summary)}"
        )
        where = output_location(pipeline, settings, None)
        return Output(None, metadata=summary_metadata(discovery, summary, where))

    @job(
        name=f"{pipeline.name}_incremental",
        description=f"Discover new input of pipeline {pipeline.name} and process every "
        "unassigned split.",
        tags={PIPELINE_TAG: pipeline.name},
    )
    def _job() -> None:
        process_new_splits()

    return _job
