"""Asset checks of ``enriched_events``, evaluated and reported per partition (day).

A check runs with every materialisation of the asset (non-blocking: a failed check is
reported, the run and downstream assets go on) or alone from the UI. It checks the days the
run materialised; a check-only run without a partition checks the latest materialised day.

Per partition: the checks are partitioned like the asset (``partitions_def``, a preview
feature of dagster 1.13), and each day gets its own check evaluation, attributed to that
partition and to that partition's latest materialisation, so the UI shows a result per day
(a backfill's single run over a range of days included). ``AssetCheckResult`` carries no
partition in dagster 1.13 — a result is attributed to the step's partition, and a range step
has none — so the checks yield one ``AssetCheckEvaluation`` per day (which the step executor
records like the evaluation it derives from a result) and then the check's output.

Where the numbers come from, per day D (``<output>`` is the enriched events table folder):
- rows out: rows in the Parquet files of ``<output>/dt=D`` (their footers; no data is read).
- rows committed: rows of the committed Parquet sink transactions whose files belong to
  D's current generation — published into ``<output>/dt=D`` since D's latest rebuild was
  swapped in (ever, without one), or by that rebuild — summed over every run that committed
  them (so the runs of a range, or incremental runs after a rebuild, are counted correctly).
- dead letters: rows of ``sluice.dead_letters`` of the splits registered for D.
- rows in = rows committed + dead letters: every record read is committed or dead-lettered.

Output is partitioned by event date and splits by landing folder date; the demo data (and the
usual landing layout) keep the two equal. ``rows out == rows in - dead letters`` then says
that the table holds exactly what the platform committed: a lost, duplicated or stray file
breaks it. The event ids of the partition are checked for duplicates separately.
"""

import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import date
from pathlib import Path
from typing import Any, cast

import sqlalchemy as sa
from dagster import (
    AssetCheckEvaluation,
    AssetCheckExecutionContext,
    AssetCheckResult,
    AssetChecksDefinition,
    AssetCheckSeverity,
    AssetRecordsFilter,
    MetadataValue,
    Output,
    PreviewWarning,
    asset_check,
)

# Not exported by dagster 1.13; the evaluation's link to the materialisation it checked.
from dagster._core.definitions.asset_checks.asset_check_evaluation import (
    AssetCheckEvaluationTargetMaterializationData,
)

from dagster_project._pipeline import parquet_files
from dagster_project.assets import daily_partitions, enriched_events
from dagster_project.resources import SluiceResource
from enumerator_service import Settings, connect_engine, database_url
from enumerator_service._schema import dead_letters, splits

__all__ = [
    "PartitionCounts",
    "checked_days",
    "dead_letter_ratio",
    "enriched_events_checks",
    "no_duplicate_event_ids",
    "partition_counts",
    "rows_reconcile",
]

#: Duplicated event ids listed in a failed check's metadata.
SAMPLE_IDS = 5


def checked_days(context: AssetCheckExecutionContext) -> list[date]:
    """The run's partitions; without any, the latest materialised partition (or none)."""
    if context.has_partition_key or context.has_partition_key_range:
        return [date.fromisoformat(key) for key in context.partition_keys]
    event = context.instance.get_latest_materialization_event(enriched_events.key)
    materialization = event.asset_materialization if event is not None else None
    if materialization is None or materialization.partition is None:
        return []
    return [date.fromisoformat(materialization.partition)]


def _partition_folder(settings: Settings, day: date) -> Path:
    return settings.output_path / f"dt={day.isoformat()}"


def _target(
    context: AssetCheckExecutionContext, day: date
) -> AssetCheckEvaluationTargetMaterializationData | None:
    """The day's latest materialisation: the one its evaluation checked.

    Dagster links a result to the materialisation of the step's partition the same way; with
    the link the UI knows the check is current for that partition.
    """
    records = context.instance.fetch_materializations(
        AssetRecordsFilter(asset_key=enriched_events.key, asset_partitions=[day.isoformat()]),
        limit=1,
    ).records
    if not records:
        return None
    record = records[0]
    return AssetCheckEvaluationTargetMaterializationData(
        run_id=record.event_log_entry.run_id,
        storage_id=record.storage_id,
        timestamp=record.timestamp,
    )


#: What a check yields: per-day evaluations and its output, or one result.
CheckEvents = Iterator[AssetCheckEvaluation | AssetCheckResult | Output[None]]


def _report(
    context: AssetCheckExecutionContext, check_name: str, outcomes: Mapping[date, AssetCheckResult]
) -> CheckEvents:
    """One evaluation per day, attributed to that partition, then the check's (empty) output.

    ``outcomes`` holds each day's result (passed, metadata, severity, description).
    """
    for day, outcome in outcomes.items():
        yield AssetCheckEvaluation(
            asset_key=enriched_events.key,
            check_name=check_name,
            passed=outcome.passed,
            metadata=outcome.metadata,
            severity=outcome.severity,
            description=outcome.description,
            blocking=False,
            partition=day.isoformat(),
            target_materialization_data=_target(context, day),
        )
    # The step must produce its output; Dagster yields it for a result the same way.
    yield Output(None)


def _skipped(
    settings: Settings, days: Sequence[date]
) -> AssetCheckResult | dict[date, AssetCheckResult] | None:
    """A result when there is nothing to check, per-day results when the sink is not
    Parquet (nothing of this table to check), else None: check the days."""
    if not days:
        return AssetCheckResult(passed=True, description="no partition materialised yet")
    if settings.sink != "parquet":
        return {
            day: AssetCheckResult(
                passed=True,
                description=f"not applicable: the sink is {settings.sink}, not Parquet",
                metadata={"sink": MetadataValue.text(settings.sink)},
            )
            for day in days
        }
    return None


# --------------------------------------------------------------------------- counts


@dataclass(frozen=True, slots=True)
class PartitionCounts:
    """Row accounting of one day of enriched events (see the module docstring)."""

    day: date
    rows_out: int
    rows_committed: int
    dead_letters: int
    splits: int
    splits_completed: int

    @property
    def rows_in(self) -> int:
        return self.rows_committed + self.dead_letters

    @property
    def dead_letter_ratio(self) -> float:
        return self.dead_letters / self.rows_in if self.rows_in else 0.0

    @property
    def reconciles(self) -> bool:
        return self.rows_out == self.rows_in - self.dead_letters and (
            self.splits_completed == self.splits
        )


# Rows committed into each day's *current* generation: files published into ``dt=D/`` after
# the day's latest rebuild was swapped in (all of them without a rebuild), plus the files that
# rebuild published into its own folder (now ``dt=D/``). Earlier generations are not counted.
_COMMITTED_ROWS = """
WITH files AS (
    SELECT t.committed_at, f.value ->> 'final' AS final, CAST(f.value ->> 'rows' AS bigint) AS rows
    FROM sluice.sink_transactions AS t, jsonb_array_elements(t.staged) AS f(value)
    WHERE t.committed AND t.sink = :sink
), latest AS (
    SELECT DISTINCT ON (partition_key) partition_key, id, swapped_at
    FROM sluice.partition_rebuilds
    WHERE source = :source AND status = 'DONE' AND partition_key = ANY(:days)
    ORDER BY partition_key, id DESC
), wanted AS (
    SELECT day FROM unnest(CAST(:days AS date[])) AS day
)
SELECT w.day, SUM(files.rows)
FROM wanted AS w
LEFT JOIN latest AS l ON l.partition_key = w.day
JOIN files ON (
    starts_with(files.final, :root || 'dt=' || w.day || '/')
    AND (l.swapped_at IS NULL OR files.committed_at > l.swapped_at)
) OR (
    l.id IS NOT NULL
    AND starts_with(files.final, :root || '_rebuilds/dt=' || w.day || '/' || l.id || '/')
)
GROUP BY w.day
"""


def partition_counts(settings: Settings, days: Sequence[date]) -> list[PartitionCounts]:
    """Parquet footers plus three aggregate queries on the platform database."""
    import pyarrow.parquet as pq

    from spark_jobs.sink import SINK_NAME

    committed_query = sa.text(_COMMITTED_ROWS).bindparams(
        sa.bindparam("days", type_=sa.ARRAY(sa.Date))
    )
    committed_params = {
        "sink": SINK_NAME,
        "source": settings.source_name,
        "days": list(days),
        "root": f"{settings.output_path}/",
    }
    splits_query = (
        sa.select(
            splits.c.partition_key,
            sa.func.count(),
            sa.func.count().filter(splits.c.status == "COMPLETED"),
        )
        .where(splits.c.source == settings.source_name, splits.c.partition_key.in_(days))
        .group_by(splits.c.partition_key)
    )
    dead_query = (
        sa.select(splits.c.partition_key, sa.func.count())
        .select_from(dead_letters.join(splits, dead_letters.c.split_id == splits.c.id))
        .where(splits.c.source == settings.source_name, splits.c.partition_key.in_(days))
        .group_by(splits.c.partition_key)
    )
    engine = connect_engine(database_url(settings), pool_size=1)
    try:
        with engine.connect() as conn:
            committed = {
                key.isoformat(): int(rows)
                for key, rows in conn.execute(committed_query, committed_params)
            }
            split_counts = {key: (int(n), int(done)) for key, n, done in conn.execute(splits_query)}
            dead = {key: int(n) for key, n in conn.execute(dead_query)}
    finally:
        engine.dispose()
    counts = []
    for day in days:
        files = parquet_files(_partition_folder(settings, day))
        rows_out = sum(pq.read_metadata(path).num_rows for path in files)
        total, done = split_counts.get(day, (0, 0))
        counts.append(
            PartitionCounts(
                day=day,
                rows_out=rows_out,
                rows_committed=committed.get(day.isoformat(), 0),
                dead_letters=dead.get(day, 0),
                splits=total,
                splits_completed=done,
            )
        )
    return counts


# --------------------------------------------------------------------------- checks


def _evaluate(
    context: AssetCheckExecutionContext,
    settings: Settings,
    name: str,
    outcomes_of: Callable[[list[date]], dict[date, AssetCheckResult]],
) -> CheckEvents:
    """Check ``name`` over the run's days: ``outcomes_of(days)`` gives one result per day,
    unless there is nothing to check (then what ``_skipped`` says is reported)."""
    days = checked_days(context)
    skipped = _skipped(settings, days)
    if isinstance(skipped, AssetCheckResult):
        yield skipped
        return
    yield from _report(context, name, skipped if skipped is not None else outcomes_of(days))


def _per_partition_check(fn: Callable[..., CheckEvents]) -> AssetChecksDefinition:
    """``@asset_check`` of ``enriched_events``, partitioned like it and non-blocking.

    Partitioned checks are a preview feature of dagster 1.13: opting in is deliberate (see the
    module docstring). Dagster annotates the decorated function as returning one result; its
    step executor also takes a generator of evaluations, which is what these checks are.
    """
    decorate = asset_check(asset=enriched_events, blocking=False, partitions_def=daily_partitions)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PreviewWarning)
        return decorate(cast(Callable[..., AssetCheckResult], fn))


@_per_partition_check
def no_duplicate_event_ids(
    context: AssetCheckExecutionContext, sluice: SluiceResource
) -> CheckEvents:
    """No event id appears twice in a partition's Parquet files."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    settings = sluice.settings()

    def outcomes_of(days: list[date]) -> dict[date, AssetCheckResult]:
        outcomes: dict[date, AssetCheckResult] = {}
        for day in days:
            files = parquet_files(_partition_folder(settings, day))
            ids = (
                pq.read_table(files, columns=["event_id"]).column("event_id")
                if files
                else pa.chunked_array([], pa.string())
            )
            counts = pa.table({"event_id": ids}).group_by("event_id").aggregate([([], "count_all")])
            repeated = counts.filter(pc.greater(counts.column("count_all"), 1))
            duplicates = len(ids) - counts.num_rows
            metadata: dict[str, Any] = {
                "rows": MetadataValue.int(len(ids)),
                "duplicate_rows": MetadataValue.int(duplicates),
            }
            if repeated.num_rows:
                sample = repeated.column("event_id").to_pylist()[:SAMPLE_IDS]
                metadata["sample_event_ids"] = MetadataValue.text(", ".join(sample))
            outcomes[day] = AssetCheckResult(
                passed=not repeated.num_rows,
                metadata=metadata,
                description=(
                    f"{day}: {duplicates} duplicate rows ({repeated.num_rows} event ids)"
                    if repeated.num_rows
                    else None
                ),
            )
        return outcomes

    yield from _evaluate(context, settings, "no_duplicate_event_ids", outcomes_of)


@_per_partition_check
def rows_reconcile(context: AssetCheckExecutionContext, sluice: SluiceResource) -> CheckEvents:
    """Rows out == rows in - dead letters for the partition, and all its splits are done."""
    settings = sluice.settings()

    def outcomes_of(days: list[date]) -> dict[date, AssetCheckResult]:
        outcomes: dict[date, AssetCheckResult] = {}
        for c in partition_counts(settings, days):
            description = None
            if not c.reconciles:
                description = (
                    f"{c.day}: {c.rows_out} rows out, expected {c.rows_in - c.dead_letters}"
                )
                if c.splits_completed != c.splits:
                    description += (
                        f", {c.splits - c.splits_completed} of {c.splits} splits not completed"
                    )
            outcomes[c.day] = AssetCheckResult(
                passed=c.reconciles,
                metadata={
                    "rows_in": MetadataValue.int(c.rows_in),
                    "dead_letters": MetadataValue.int(c.dead_letters),
                    "rows_out": MetadataValue.int(c.rows_out),
                    "splits": MetadataValue.int(c.splits),
                    "splits_completed": MetadataValue.int(c.splits_completed),
                },
                description=description,
            )
        return outcomes

    yield from _evaluate(context, settings, "rows_reconcile", outcomes_of)


@_per_partition_check
def dead_letter_ratio(context: AssetCheckExecutionContext, sluice: SluiceResource) -> CheckEvents:
    """Dead letters are at most ``max_dead_letter_ratio`` of the partition's records."""
    settings = sluice.settings()
    limit = sluice.max_dead_letter_ratio

    def outcomes_of(days: list[date]) -> dict[date, AssetCheckResult]:
        outcomes: dict[date, AssetCheckResult] = {}
        for c in partition_counts(settings, days):
            failed = c.dead_letter_ratio > limit
            outcomes[c.day] = AssetCheckResult(
                passed=not failed,
                severity=AssetCheckSeverity.WARN,
                metadata={
                    "max_dead_letter_ratio": MetadataValue.float(limit),
                    "dead_letter_ratio": MetadataValue.float(c.dead_letter_ratio),
                    "dead_letters": MetadataValue.int(c.dead_letters),
                    "rows_in": MetadataValue.int(c.rows_in),
                },
                description=(
                    f"{c.day}: {c.dead_letter_ratio:.2%} dead letters (limit {limit:.2%})"
                    if failed
                    else None
                ),
            )
        return outcomes

    yield from _evaluate(context, settings, "dead_letter_ratio", outcomes_of)


#: Every check of enriched_events, for the Definitions.
enriched_events_checks = [no_duplicate_event_ids, rows_reconcile, dead_letter_ratio]
