"""A pipeline's asset checks, evaluated and reported per partition (day).

- ``unique_key``: no output key (the pipeline's ``key``, or its sink's ``upsert_key``)
  appears twice in a partition — when the pipeline declares one;
- ``rows_reconcile``: rows out == rows committed, and every split of the partition completed
  (see ``_counts``; an upsert sink only checks the splits);
- ``dead_letter_ratio``: dead letters are at most ``max_dead_letter_ratio`` of the records
  (a warning);
- ``no_quarantined_splits``: no split of the partition is quarantined (FAILED: a poison file
  whose content failed ``SLUICE_SPLIT_MAX_ATTEMPTS`` attempts); the metadata lists the files,
  reasons and last errors (``sluice retry`` puts them back).

A check runs with every materialisation of the asset (non-blocking) or alone from the UI; it
checks the days the run materialised, or the latest materialised day. The checks are
partitioned like the asset (``partitions_def``, a preview feature of dagster 1.13) and each
day gets its own evaluation, attributed to that partition and to its latest
materialisation — ``AssetCheckResult`` carries no partition in 1.13, so the checks yield one
``AssetCheckEvaluation`` per day and then the check's output. An unpartitioned output is
checked whole, with one result.
"""

import warnings
from collections.abc import Callable, Iterator
from datetime import date
from typing import cast

from dagster import (
    AssetCheckEvaluation,
    AssetCheckExecutionContext,
    AssetCheckResult,
    AssetChecksDefinition,
    AssetKey,
    AssetRecordsFilter,
    DagsterInstance,
    Output,
    PreviewWarning,
    asset_check,
)

# Not exported by dagster 1.13; the evaluation's link to the materialisation it checked.
from dagster._core.definitions.asset_checks.asset_check_evaluation import (
    AssetCheckEvaluationTargetMaterializationData,
)

from dagster_project._check_outcomes import CHECK_DESCRIPTIONS, check_names, outcomes_of
from dagster_project.assets import DayPartitions
from dagster_project.resources import SluiceResource
from enumerator_service import partition_date
from spark_jobs.pipeline import Pipeline

__all__ = ["partition_evaluation", "pipeline_checks"]

CheckEvents = Iterator[AssetCheckEvaluation | AssetCheckResult | Output[None]]


def _checked_days(
    context: AssetCheckExecutionContext, key: AssetKey, partitioned: bool
) -> list[date | None]:
    """The run's partitions; without any, the latest materialised one (or none)."""
    if not partitioned:
        return [None]
    if context.has_partition_key or context.has_partition_key_range:
        return [partition_date(k, "Dagster partition key") for k in context.partition_keys]
    event = context.instance.get_latest_materialization_event(key)
    materialization = event.asset_materialization if event is not None else None
    if materialization is None or materialization.partition is None:
        return []
    return [partition_date(materialization.partition, "Dagster partition key")]


def _target(
    instance: DagsterInstance, key: AssetKey, day: date
) -> AssetCheckEvaluationTargetMaterializationData | None:
    """The day's latest materialisation: the one its evaluation checked."""
    records = instance.fetch_materializations(
        AssetRecordsFilter(asset_key=key, asset_partitions=[day.isoformat()]), limit=1
    ).records
    if not records:
        return None
    record = records[0]
    return AssetCheckEvaluationTargetMaterializationData(
        run_id=record.event_log_entry.run_id,
        storage_id=record.storage_id,
        timestamp=record.timestamp,
    )


def partition_evaluation(
    instance: DagsterInstance, key: AssetKey, name: str, day: date, outcome: AssetCheckResult
) -> AssetCheckEvaluation:
    """Check ``name``'s ``outcome`` for partition ``day``, attributed to its latest
    materialisation (from a run's step, or reported runless by the completion reporter)."""
    return AssetCheckEvaluation(
        asset_key=key,
        check_name=name,
        passed=outcome.passed,
        metadata=outcome.metadata,
        severity=outcome.severity,
        description=outcome.description,
        blocking=False,
        partition=day.isoformat(),
        target_materialization_data=_target(instance, key, day),
    )


def _evaluate(
    context: AssetCheckExecutionContext,
    key: AssetKey,
    partitioned: bool,
    name: str,
    outcomes_of: Callable[[list[date | None]], dict[date | None, AssetCheckResult]],
) -> CheckEvents:
    days = _checked_days(context, key, partitioned)
    if not days:
        yield AssetCheckResult(passed=True, description="no partition materialised yet")
        return
    outcomes = outcomes_of(days)
    if not partitioned:
        yield outcomes[None]
        return
    for day, outcome in outcomes.items():
        assert day is not None
        yield partition_evaluation(context.instance, key, name, day, outcome)
    # The step must produce its output; Dagster yields it for a result the same way.
    yield Output(None)


def pipeline_checks(
    pipeline: Pipeline, key: AssetKey, partitions: DayPartitions | None
) -> list[AssetChecksDefinition]:
    partitioned = partitions is not None
    keys = ", ".join(pipeline.plan.key or ())

    def check(name: str) -> AssetChecksDefinition:
        def fn(context: AssetCheckExecutionContext, sluice: SluiceResource) -> CheckEvents:
            settings = sluice.settings()  # (the resource's ratio, if set, overrides it)
            outcomes = outcomes_of(pipeline, settings, name, settings.max_dead_letter_ratio)
            yield from _evaluate(context, key, partitioned, name, outcomes)

        # Partitioned checks are a preview feature of dagster 1.13: opting in is deliberate.
        decorate = asset_check(
            asset=key,
            name=name,
            blocking=False,
            partitions_def=partitions,
            description=CHECK_DESCRIPTIONS[name].format(keys=keys),
        )
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", PreviewWarning)
            return decorate(cast(Callable[..., AssetCheckResult], fn))

    return [check(name) for name in check_names(pipeline)]
