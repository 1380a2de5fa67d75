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
from collections.abc import Callable, Iterator, Mapping
from datetime import date
from typing import Any, cast

import sqlalchemy as sa
from dagster import (
    AssetCheckEvaluation,
    AssetCheckExecutionContext,
    AssetCheckResult,
    AssetChecksDefinition,
    AssetCheckSeverity,
    AssetKey,
    AssetRecordsFilter,
    DailyPartitionsDefinition,
    MetadataValue,
    Output,
    PreviewWarning,
    asset_check,
)

# Not exported by dagster 1.13; the evaluation's link to the materialisation it checked.
from dagster._core.definitions.asset_checks.asset_check_evaluation import (
    AssetCheckEvaluationTargetMaterializationData,
)

from dagster_project._counts import PartitionCounts, partition_counts, partition_folder
from dagster_project._runs import parquet_files
from dagster_project.resources import SluiceResource
from enumerator_service import Settings, connect_engine, database_url
from enumerator_service._quarantine import quarantined
from enumerator_service._safe_paths import partition_date
from spark_jobs.pipeline import Pipeline
from spark_jobs.pipeline._errors import quote

__all__ = ["pipeline_checks"]

#: Duplicated keys listed in a failed check's metadata.
SAMPLE_KEYS = 5
CheckEvents = Iterator[AssetCheckEvaluation | AssetCheckResult | Output[None]]
Outcomes = Callable[[list[date | None]], dict[date | None, AssetCheckResult]]


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
    context: AssetCheckExecutionContext, key: AssetKey, day: date
) -> AssetCheckEvaluationTargetMaterializationData | None:
    """The day's latest materialisation: the one its evaluation checked."""
    records = context.instance.fetch_materializations(
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


def _evaluate(
    context: AssetCheckExecutionContext,
    key: AssetKey,
    partitioned: bool,
    name: str,
    outcomes_of: Outcomes,
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
        yield AssetCheckEvaluation(
            asset_key=key,
            check_name=name,
            passed=outcome.passed,
            metadata=outcome.metadata,
            severity=outcome.severity,
            description=outcome.description,
            blocking=False,
            partition=day.isoformat(),
            target_materialization_data=_target(context, key, day),
        )
    # The step must produce its output; Dagster yields it for a result the same way.
    yield Output(None)


def _label(day: date | None) -> str:
    return "the output" if day is None else str(day)


def _duplicates(pipeline: Pipeline, settings: Settings, day: date | None) -> tuple[int, list[str]]:
    """(duplicate rows, sample keys) of the key in one partition."""
    key = list(pipeline.plan.key or ())
    sink = pipeline.plan.sink
    if sink.kind == "postgres":
        assert sink.table is not None
        table = f"{quote(sink.table[0])}.{quote(sink.table[1])}"
        columns = ", ".join(quote(k) for k in key)
        where = "" if day is None else "WHERE dt = :day"
        engine = connect_engine(database_url(settings, create=False), pool_size=1)
        try:
            with engine.connect() as conn:
                if conn.execute(sa.text("SELECT to_regclass(:t)"), {"t": table}).scalar() is None:
                    return 0, []
                rows = conn.execute(
                    sa.text(
                        f"SELECT {columns}, count(*) FROM {table} {where} GROUP BY {columns} "
                        "HAVING count(*) > 1 ORDER BY count(*) DESC"
                    ),
                    {"day": day},
                ).all()
        finally:
            engine.dispose()
        return sum(int(r[-1]) - 1 for r in rows), [str(tuple(r[:-1])) for r in rows[:SAMPLE_KEYS]]
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    files = parquet_files(partition_folder(pipeline, settings, day))
    if not files:
        return 0, []
    table = pq.read_table(files, columns=key)
    counts = table.group_by(key).aggregate([([], "count_all")])
    repeated = counts.filter(pc.greater(counts.column("count_all"), 1))
    sample = repeated.select(key).slice(0, SAMPLE_KEYS).to_pylist()
    return table.num_rows - counts.num_rows, [str(tuple(row.values())) for row in sample]


def pipeline_checks(
    pipeline: Pipeline, key: AssetKey, partitions: DailyPartitionsDefinition | None
) -> list[AssetChecksDefinition]:
    partitioned = partitions is not None

    def check(fn: Callable[..., CheckEvents], description: str) -> AssetChecksDefinition:
        # Partitioned checks are a preview feature of dagster 1.13: opting in is deliberate.
        decorate = asset_check(
            asset=key,
            name=fn.__name__,
            blocking=False,
            partitions_def=partitions,
            description=description,
        )
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", PreviewWarning)
            return decorate(cast(Callable[..., AssetCheckResult], fn))

    def counts_outcomes(
        settings: Settings, make: Callable[[PartitionCounts], AssetCheckResult]
    ) -> Outcomes:
        return lambda days: {c.day: make(c) for c in partition_counts(pipeline, settings, days)}

    def rows_reconcile(context: AssetCheckExecutionContext, sluice: SluiceResource) -> CheckEvents:
        def outcome(c: PartitionCounts) -> AssetCheckResult:
            description = None
            if not c.reconciles:
                description = (
                    f"{_label(c.day)}: {c.rows_out} rows out, {c.rows_committed} committed"
                )
                if c.splits_completed != c.splits:
                    description += (
                        f", {c.splits - c.splits_completed} of {c.splits} splits not completed"
                    )
            metadata: dict[str, Any] = {
                "rows_out": MetadataValue.int(c.rows_out),
                "rows_committed": MetadataValue.int(c.rows_committed),
                "dead_letters": MetadataValue.int(c.dead_letters),
                "splits": MetadataValue.int(c.splits),
                "splits_completed": MetadataValue.int(c.splits_completed),
            }
            if not c.comparable:
                metadata["note"] = MetadataValue.text("upsert sink: rows merge by key")
            return AssetCheckResult(passed=c.reconciles, metadata=metadata, description=description)

        outcomes = counts_outcomes(sluice.settings(), outcome)
        yield from _evaluate(context, key, partitioned, "rows_reconcile", outcomes)

    def dead_letter_ratio(
        context: AssetCheckExecutionContext, sluice: SluiceResource
    ) -> CheckEvents:
        limit = sluice.max_dead_letter_ratio

        def outcome(c: PartitionCounts) -> AssetCheckResult:
            failed = c.dead_letter_ratio > limit
            return AssetCheckResult(
                passed=not failed,
                severity=AssetCheckSeverity.WARN,
                metadata={
                    "max_dead_letter_ratio": MetadataValue.float(limit),
                    "dead_letter_ratio": MetadataValue.float(c.dead_letter_ratio),
                    "dead_letters": MetadataValue.int(c.dead_letters),
                    "rows_in": MetadataValue.int(c.rows_in),
                },
                description=(
                    f"{_label(c.day)}: {c.dead_letter_ratio:.2%} dead letters (limit {limit:.2%})"
                    if failed
                    else None
                ),
            )

        outcomes = counts_outcomes(sluice.settings(), outcome)
        yield from _evaluate(context, key, partitioned, "dead_letter_ratio", outcomes)

    def unique_key(context: AssetCheckExecutionContext, sluice: SluiceResource) -> CheckEvents:
        settings = sluice.settings()

        def outcomes(days: list[date | None]) -> dict[date | None, AssetCheckResult]:
            found: dict[date | None, AssetCheckResult] = {}
            for day in days:
                duplicates, sample = _duplicates(pipeline, settings, day)
                metadata: Mapping[str, Any] = {"duplicate_rows": MetadataValue.int(duplicates)}
                if sample:
                    metadata = {**metadata, "sample_keys": MetadataValue.text(", ".join(sample))}
                found[day] = AssetCheckResult(
                    passed=duplicates == 0,
                    metadata=dict(metadata),
                    description=f"{_label(day)}: {duplicates} duplicate rows"
                    if duplicates
                    else None,
                )
            return found

        yield from _evaluate(context, key, partitioned, "unique_key", outcomes)

    def no_quarantined_splits(
        context: AssetCheckExecutionContext, sluice: SluiceResource
    ) -> CheckEvents:
        settings = sluice.settings()

        def outcomes(days: list[date | None]) -> dict[date | None, AssetCheckResult]:
            engine = connect_engine(database_url(settings), pool_size=1)
            try:
                wanted = None if days == [None] else [d for d in days if d is not None]
                failed = quarantined(engine, pipeline.name, days=wanted)
            finally:
                engine.dispose()
            found: dict[date | None, AssetCheckResult] = {}
            for day in days:
                mine = [s for s in failed if day is None or s.partition_key == day]
                metadata: dict[str, Any] = {"quarantined_splits": MetadataValue.int(len(mine))}
                if mine:
                    metadata["files"] = MetadataValue.md(
                        "\n".join(f"- split {s.id}: {s.line()}" for s in mine[:50])
                    )
                found[day] = AssetCheckResult(
                    passed=not mine,
                    metadata=metadata,
                    description=(
                        f"{_label(day)}: {len(mine)} quarantined splits "
                        f"({', '.join(sorted({s.reason for s in mine}))}); "
                        "fix the files, then sluice retry --all-failed"
                        if mine
                        else None
                    ),
                )
            return found

        yield from _evaluate(context, key, partitioned, "no_quarantined_splits", outcomes)

    checks = [
        check(rows_reconcile, "Rows out == rows committed, and every split completed."),
        check(dead_letter_ratio, "Dead letters are at most max_dead_letter_ratio of the records."),
        check(no_quarantined_splits, "No split is quarantined (a poison file failing its reads)."),
    ]
    if pipeline.plan.key:
        keys = ", ".join(pipeline.plan.key)
        checks.insert(0, check(unique_key, f"No key ({keys}) appears twice in a partition."))
    return checks
