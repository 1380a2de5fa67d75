"""Reporting completed output partitions to Dagster, exactly once per partition and generation.

Postgres is the source of truth: whatever completed a day of a pipeline's output — a CLI run,
the schedule, the continuous reader, a backfill — wrote a row to ``partition_completions`` in
the checkpoint transaction that completed it. The pipeline's ``<pipeline>_report_completions``
sensor turns each row it has not reported (``reported_at`` NULL) into

1. an ``AssetMaterialization`` of that partition of the output asset, runless, tagged
   ``sluice/source``, ``sluice/partition`` and ``sluice/generation`` (metadata: rows, dead
   letters, late records, watermark, generation, run and checkpoint), then
2. the row's ``reported_at`` mark, and
3. a request for a run of the output's asset checks for that partition, run key
   ``<pipeline>:checks:<day>:g<generation>`` (the checks attribute their evaluations to the
   partition's latest materialisation: the one just reported; tagged ``sluice/checks``, so
   the run queue runs one per pipeline at a time). When one tick reports several
   generations of a day (rebuilt or reopened since), only the last is checked: the checks
   read the day's output as it is now, so the others would repeat the same evaluation.

Why a run for the checks: Dagster runs a check only in a run that selects it, and a runless
materialisation starts none. Reporting runless ``AssetCheckEvaluation`` events computed in the
tick was tried and does not work in dagster 1.13: the event log keeps one runless evaluation
per (asset, check, partition) (unique index ``idx_asset_check_executions_unique`` on run id
"" and the partition), so a partition reported again (generation 2, or a crash recovered)
could never be checked again. A run per completed partition costs a run, and gives each
evaluation its run, logs and retry in the UI; its run key makes Dagster drop a repeated
request (a tick re-run after a crash).

A day completed by a run that materialises the output asset itself (a launch or backfill
from the UI, Sluice run ``dagster-<run id>``) is not reported a second time: once that run
has succeeded its own materialisation is the report (and its checks ran with it), so the row
is only marked; while it runs, the row waits; if it failed, the row is reported as above.

Exactly once: a crash between Postgres's commit and step 1 leaves the row unreported, so the
next tick reports it. A crash between step 1 and step 2 leaves a materialisation in Dagster
and the row unmarked: before reporting a row the tick looks in the event log for a
materialisation of that partition carrying the row's three tags, and finds
it, so it only marks the row and requests the checks' run again (the same run key: Dagster
launches it once). A daemon that dies after the tick returned and before it submitted the
requested runs loses the checks' run of those partitions (the rows are marked): the UI can
run them; the completion itself is never lost nor doubled.

The look-up and the report are not atomic, so two reporters of the same pipeline at once
could both report: Dagster runs one evaluation of a sensor at a time, which is what this
relies on (the mark itself is idempotent).

Threading: the sensor runs on the daemon's sensor thread; every call opens and closes its own
database engine.
"""

# No "from __future__ import annotations": Dagster inspects the context annotations.

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from dagster import (
    AssetCheckKey,
    AssetKey,
    AssetMaterialization,
    AssetRecordsFilter,
    AssetSelection,
    DagsterEventType,
    DagsterInstance,
    DagsterRun,
    DagsterRunStatus,
    DefaultSensorStatus,
    MetadataValue,
    PartitionsDefinition,
    RunRequest,
    SensorDefinition,
    SensorEvaluationContext,
    SensorResult,
    SkipReason,
    sensor,
)

from dagster_project._partitions import sync_partitions
from dagster_project._runs import PIPELINE_TAG
from dagster_project.assets import output_metadata
from dagster_project.resources import SluiceResource
from enumerator_service import (
    PartitionCompletion,
    Settings,
    completions_table_exists,
    mark_reported,
    open_platform,
    unreported_completions,
)
from spark_jobs.connectors import source_connector_named
from spark_jobs.pipeline import Pipeline

__all__ = [
    "CHECKS_TAG",
    "GENERATION_TAG",
    "PARTITION_TAG",
    "REPORT_BATCH",
    "SOURCE_TAG",
    "Reported",
    "checks_run_request",
    "completion_materialization",
    "completion_tags",
    "is_reported",
    "report_completions",
    "report_completions_sensor",
]

#: Tags of a reported completion's materialisation: the pipeline and the generation.
SOURCE_TAG = "sluice/source"
GENERATION_TAG = "sluice/generation"
PARTITION_TAG = "sluice/partition"
#: Tag of a checks' run (value: the pipeline), limited to one at a time per pipeline by the
#: Dagster homes Sluice writes (``sluice dagster-home``, docker/dagster.yaml): a reporter that
#: catches up on many days requests a run per day, and each run is a process of its own.
CHECKS_TAG = "sluice/checks"
#: Completions one tick reports at most (a tick must stay well inside Dagster's sensor timeout;
#: the rest go to the next ticks).
REPORT_BATCH = 50
#: Materialisations of one partition read per page when looking for an earlier report.
_PAGE = 100


def completion_tags(completion: PartitionCompletion) -> dict[str, str]:
    """What identifies a completion's report in the event log (the partition is a tag too,
    so an unpartitioned output's reports are told apart by day)."""
    return {
        SOURCE_TAG: completion.source,
        PARTITION_TAG: completion.partition_key.isoformat(),
        GENERATION_TAG: str(completion.generation),
    }


def completion_materialization(
    key: AssetKey,
    completion: PartitionCompletion,
    partitioned: bool,
    output: Mapping[str, MetadataValue[Any]] | None = None,
) -> AssetMaterialization:
    """The materialisation that reports ``completion`` (the whole output when unpartitioned);
    ``output``: what the sink tells about its output now (``output_metadata``)."""
    day = completion.partition_key.isoformat()
    metadata: dict[str, Any] = {
        **(output or {}),
        "rows": MetadataValue.int(completion.rows),
        "dead_letters": MetadataValue.int(completion.dead_letters),
        "late_records": MetadataValue.int(completion.late_records),
        "generation": MetadataValue.int(completion.generation),
        "run_id": MetadataValue.text(completion.run_id),
        "checkpoint_id": MetadataValue.int(completion.checkpoint_id),
        "completed_at": MetadataValue.timestamp(completion.completed_at),
    }
    if completion.watermark is not None:
        metadata["watermark"] = MetadataValue.timestamp(completion.watermark)
    if not partitioned:
        metadata["partition_key"] = MetadataValue.text(day)
    return AssetMaterialization(
        asset_key=key,
        partition=day if partitioned else None,
        description=f"{day} complete (generation {completion.generation})",
        metadata=metadata,
        tags=completion_tags(completion),
    )


def is_reported(
    instance: DagsterInstance, key: AssetKey, completion: PartitionCompletion, partitioned: bool
) -> bool:
    """Whether Dagster's event log holds the report of ``completion`` already (a tick that
    died after reporting and before marking)."""
    wanted = completion_tags(completion)
    partitions = [completion.partition_key.isoformat()] if partitioned else None
    cursor: str | None = None
    while True:
        page = instance.fetch_materializations(
            AssetRecordsFilter(asset_key=key, asset_partitions=partitions),
            limit=_PAGE,
            cursor=cursor,
        )
        for record in page.records:
            event = record.asset_materialization
            tags = (event.tags or {}) if event is not None else {}
            if all(tags.get(k) == v for k, v in wanted.items()):
                return True
        if not page.has_more:
            return False
        cursor = page.cursor


def checks_run_request(
    pipeline: Pipeline,
    checks: list[AssetCheckKey],
    completion: PartitionCompletion,
    partitioned: bool,
) -> RunRequest:
    """The run of the output's checks for a reported completion's partition."""
    day = completion.partition_key.isoformat()
    # The partition goes in as its tag, not as ``partition_key``: dagster 1.13 validates a
    # partition key against the selected assets' partitions, and a checks-only run selects
    # no asset ("no PartitionsDefinition shared by all the provided assets"). The tag is
    # what a check's context reads its partition from either way.
    partition = {"dagster/partition": day} if partitioned else {}
    return RunRequest(
        run_key=f"{pipeline.name}:checks:{day}:g{completion.generation}",
        asset_selection=[],
        asset_check_keys=checks,
        tags={
            PIPELINE_TAG: pipeline.name,
            CHECKS_TAG: pipeline.name,
            **completion_tags(completion),
            **partition,
        },
    )


@dataclass
class Reported:
    """What one pass of the reporter did with each unreported completion."""

    #: Reported now (a runless materialisation): their checks' runs are requested.
    reported: list[PartitionCompletion] = field(default_factory=list)
    #: Their report was in the event log already (a crash before the mark): marked, checks
    #: requested again (same run key).
    recovered: list[PartitionCompletion] = field(default_factory=list)
    #: Completed by a run that materialised the output asset itself (a launch or backfill
    #: from the UI): its materialisation is the report and its checks ran with it; marked.
    by_asset_run: list[PartitionCompletion] = field(default_factory=list)
    #: Completed by an asset run still in progress: left for a later tick (its own
    #: materialisation comes at its end).
    waiting: list[PartitionCompletion] = field(default_factory=list)

    @property
    def checked(self) -> list[PartitionCompletion]:
        return [*self.recovered, *self.reported]

    def __bool__(self) -> bool:
        return bool(self.reported or self.recovered or self.by_asset_run or self.waiting)


def _asset_run(instance: DagsterInstance, key: AssetKey, run_id: str) -> DagsterRun | None:
    """The Dagster run behind Sluice run ``run_id`` when it materialises ``key`` (an asset
    launch or backfill; ``sluice_run_id`` names those ``dagster-<run id>``), else None."""
    if not run_id.startswith("dagster-"):
        return None
    run = instance.get_run_by_id(run_id.removeprefix("dagster-"))
    if run is None:
        return None
    if run.asset_selection:
        return run if key in run.asset_selection else None
    # A run of a whole asset job selects nothing (None, or empty): its plan says what it
    # materialises.
    planned = instance.get_records_for_run(
        run.run_id, of_type=DagsterEventType.ASSET_MATERIALIZATION_PLANNED
    ).records
    for record in planned:
        event = record.event_log_entry.dagster_event
        if event is not None and event.asset_key == key:
            return run
    return None


def report_completions(
    instance: DagsterInstance,
    pipeline: Pipeline,
    settings: Settings,
    key: AssetKey,
    partitions: PartitionsDefinition | None,
    *,
    limit: int = REPORT_BATCH,
) -> Reported:
    """Report ``pipeline``'s unreported completions (none without ``partition_completions``:
    its migration not yet applied)."""
    engine = open_platform(settings, migrate=False, pool_size=1).engine
    done = Reported()
    partitioned = partitions is not None
    try:
        # Before the report: a completed day must be a partition for the UI to show it.
        connector = source_connector_named(pipeline.plan.source.kind)
        input_days = connector.input_days(pipeline, settings) if partitioned else None
        sync_partitions(instance, partitions, engine, pipeline.name, input_days)
        if not completions_table_exists(engine):
            return done
        for completion in unreported_completions(engine, pipeline.name, limit):
            run = _asset_run(instance, key, completion.run_id)
            if run is not None and not run.is_finished:
                done.waiting.append(completion)
                continue
            if run is not None and run.status == DagsterRunStatus.SUCCESS:
                done.by_asset_run.append(completion)
            elif is_reported(instance, key, completion, partitioned):
                done.recovered.append(completion)
            else:
                output = output_metadata(pipeline, settings, completion.run_id)
                instance.report_runless_asset_event(
                    completion_materialization(key, completion, partitioned, output)
                )
                done.reported.append(completion)
            mark_reported(engine, completion)
    finally:
        engine.dispose()
    return done


def _latest_generations(completions: list[PartitionCompletion]) -> list[PartitionCompletion]:
    """The last generation of each partition, in completion order: the checks evaluate a
    partition's output as it is now, so an earlier generation reported in the same tick (a
    day rebuilt or reopened since) would only run the same checks again."""
    latest = {c.partition_key: c for c in completions}
    return [c for c in completions if latest[c.partition_key] is c]


def _describe(done: list[PartitionCompletion]) -> str:
    return ", ".join(f"{c.partition_key} (generation {c.generation})" for c in done)


def report_completions_sensor(
    pipeline: Pipeline,
    key: AssetKey,
    checks: list[AssetCheckKey],
    partitions: PartitionsDefinition | None,
) -> SensorDefinition:
    """``<pipeline>_report_completions`` (running by default): each tick adds the days
    discovered to dynamic ``partitions`` (``_partitions.sync_partitions``), reports the newly
    complete partitions of the pipeline's output and requests their checks' runs (see the
    module's docstring)."""
    partitioned = partitions is not None

    @sensor(
        name=f"{pipeline.name}_report_completions",
        minimum_interval_seconds=30,
        default_status=DefaultSensorStatus.RUNNING,
        asset_selection=AssetSelection.checks(*checks),
        description=f"Reports each completed partition of {pipeline.name} to Dagster once.",
    )
    def _sensor(
        context: SensorEvaluationContext, sluice: SluiceResource
    ) -> SensorResult | SkipReason:
        done = report_completions(context.instance, pipeline, sluice.settings(), key, partitions)
        if not done:
            return SkipReason("no newly complete partition")
        for what, completions in (
            ("reported complete", done.reported),
            ("already in Dagster, marked", done.recovered),
            ("materialised by their asset run, marked", done.by_asset_run),
            ("waiting for their asset run to end", done.waiting),
        ):
            if completions:
                context.log.info(f"{what}: {_describe(completions)}")
        requests = [
            checks_run_request(pipeline, checks, c, partitioned)
            for c in _latest_generations(done.checked)
        ]
        if not requests or not checks:
            return SkipReason("no completion to check (see the tick's log)")
        return SensorResult(run_requests=requests)

    return _sensor
