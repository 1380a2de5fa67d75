"""A pipeline's incremental job: discover new input, then process everything unassigned.

A day-partitioned pipeline's job is an op: the days a run completes are reported to Dagster by
``<pipeline>_report_completions`` (``completions``), each day once, whichever run completed
it. An unpartitioned pipeline's output is one asset with no days to report as they complete
(a CDC or Kafka stream's output completes a day only when its event time passes midnight), so
its job materialises the output asset itself, with the asset's checks: every scheduled or
sensor-requested run is then a materialisation in the asset's history, as a launch from the
UI is, and the reporter only marks the completions such a run recorded.
"""

# No "from __future__ import annotations": Dagster inspects the op's context annotation.

from collections.abc import Sequence

from dagster import (
    AssetChecksDefinition,
    AssetsDefinition,
    AssetSelection,
    JobDefinition,
    Nothing,
    OpExecutionContext,
    Out,
    Output,
    define_asset_job,
    job,
    op,
)

# Not exported by dagster 1.13 (``define_asset_job`` returns one): the type of the job.
from dagster._core.definitions.unresolved_asset_job_definition import (
    UnresolvedAssetJobDefinition,
)

from dagster_project._runs import (
    PIPELINE_TAG,
    describe_run,
    drain_and_run,
    sluice_run_id,
    summary_metadata,
)
from dagster_project.assets import output_location
from dagster_project.resources import SluiceResource
from spark_jobs.pipeline import Pipeline

__all__ = ["IncrementalJob", "incremental_job"]

#: An op job, or an asset job the code location resolves (with its resources); to run one in
#: process, resolve it through ``Definitions`` (``Definitions(assets=[output],
#: asset_checks=checks, jobs=[job], resources=...).resolve_job_def(job.name)``).
IncrementalJob = JobDefinition | UnresolvedAssetJobDefinition


def _description(pipeline: Pipeline) -> str:
    return f"Discover new input of pipeline {pipeline.name} and process every unassigned split."


def incremental_job(
    pipeline: Pipeline, output: AssetsDefinition, checks: Sequence[AssetChecksDefinition]
) -> IncrementalJob:
    """``<pipeline>_incremental``: continuous-cursor discovery (every chunk of a backlog), then
    one bounded reader run ("available now"); for an unpartitioned ``output``, as a
    materialisation of it and its ``checks`` (see the module docstring)."""
    if output.partitions_def is None:
        return _asset_job(pipeline, output, checks)
    return _op_job(pipeline)


def _asset_job(
    pipeline: Pipeline, output: AssetsDefinition, checks: Sequence[AssetChecksDefinition]
) -> UnresolvedAssetJobDefinition:
    selection: AssetSelection = AssetSelection.assets(output)
    if checks:
        selection = selection | AssetSelection.checks(*checks)
    return define_asset_job(
        name=f"{pipeline.name}_incremental",
        selection=selection,
        description=_description(pipeline),
        tags={PIPELINE_TAG: pipeline.name},
    )


def _op_job(pipeline: Pipeline) -> JobDefinition:
    @op(name=f"{pipeline.name}_process_new_splits", out=Out(Nothing))
    def process_new_splits(context: OpExecutionContext, sluice: SluiceResource) -> Output[None]:
        settings = sluice.settings()
        discovery, summary = drain_and_run(settings, pipeline, run_id=sluice_run_id(context.run))
        context.log.info(
            f"discovery: {discovery.seen}, {discovery.splits_registered} new splits; "
            f"{describe_run(summary)}"
        )
        where = output_location(pipeline, settings, None)
        return Output(None, metadata=summary_metadata(discovery, summary, where))

    @job(
        name=f"{pipeline.name}_incremental",
        description=_description(pipeline),
        tags={PIPELINE_TAG: pipeline.name},
    )
    def _job() -> None:
        process_new_splits()

    return _job
