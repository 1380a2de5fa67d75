"""Asset checks of ``enriched_events``, evaluated for the partitions of the run.

A check runs with every materialisation of the asset (non-blocking: a failed check is
reported, the run and downstream assets go on) or alone from the UI. It checks the days the
run materialised; a check-only run without a partition checks the latest materialised day.

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

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import date
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from dagster import (
    AssetCheckExecutionContext,
    AssetCheckResult,
    AssetCheckSeverity,
    MetadataValue,
    asset_check,
)

from dagster_project._pipeline import parquet_files
from dagster_project.assets import enriched_events
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


def _not_applicable(settings: Settings, days: Sequence[date]) -> AssetCheckResult | None:
    if settings.sink != "parquet":
        return AssetCheckResult(
            passed=True,
            description=f"not applicable: the sink is {settings.sink}, not Parquet",
            metadata={"sink": MetadataValue.text(settings.sink)},
        )
    if not days:
        return AssetCheckResult(passed=True, description="no partition materialised yet")
    return None


def _days_text(days: Sequence[date]) -> MetadataValue[Any]:
    return MetadataValue.text(", ".join(day.isoformat() for day in days))


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


def _counts_table(counts: Sequence[PartitionCounts]) -> str:
    lines = [
        "| dt | rows in | dead letters | rows out | splits done | dead-letter ratio |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    lines += [
        f"| {c.day.isoformat()} | {c.rows_in} | {c.dead_letters} | {c.rows_out} "
        f"| {c.splits_completed}/{c.splits} | {c.dead_letter_ratio:.4%} |"
        for c in counts
    ]
    return "\n".join(lines)


# --------------------------------------------------------------------------- checks


@asset_check(asset=enriched_events, blocking=False)
def no_duplicate_event_ids(
    context: AssetCheckExecutionContext, sluice: SluiceResource
) -> AssetCheckResult:
    """No event id appears twice in a partition's Parquet files."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    settings = sluice.settings()
    days = checked_days(context)
    skipped = _not_applicable(settings, days)
    if skipped is not None:
        return skipped
    rows = duplicates = 0
    failed: list[date] = []
    sample: list[str] = []
    for day in days:
        files = parquet_files(_partition_folder(settings, day))
        if not files:
            continue
        ids = pq.read_table(files, columns=["event_id"]).column("event_id")
        counts = pa.table({"event_id": ids}).group_by("event_id").aggregate([([], "count_all")])
        repeated = counts.filter(pc.greater(counts.column("count_all"), 1))
        rows += len(ids)
        if repeated.num_rows:
            failed.append(day)
            duplicates += len(ids) - counts.num_rows
            sample += repeated.column("event_id").to_pylist()[: SAMPLE_IDS - len(sample)]
    metadata: dict[str, Any] = {
        "partitions": _days_text(days),
        "rows": MetadataValue.int(rows),
        "duplicate_rows": MetadataValue.int(duplicates),
    }
    if failed:
        metadata["failed_partitions"] = _days_text(failed)
        metadata["sample_event_ids"] = MetadataValue.text(", ".join(sample))
    return AssetCheckResult(
        passed=not failed,
        metadata=metadata,
        description=(
            f"{duplicates} duplicate rows in {len(failed)} partition(s)" if failed else None
        ),
    )


@asset_check(asset=enriched_events, blocking=False)
def rows_reconcile(context: AssetCheckExecutionContext, sluice: SluiceResource) -> AssetCheckResult:
    """Rows out == rows in - dead letters for every partition, and all its splits are done."""
    settings = sluice.settings()
    days = checked_days(context)
    skipped = _not_applicable(settings, days)
    if skipped is not None:
        return skipped
    counts = partition_counts(settings, days)
    failed = [c for c in counts if not c.reconciles]
    metadata: dict[str, Any] = {
        "partitions": _days_text(days),
        "rows_in": MetadataValue.int(sum(c.rows_in for c in counts)),
        "dead_letters": MetadataValue.int(sum(c.dead_letters for c in counts)),
        "rows_out": MetadataValue.int(sum(c.rows_out for c in counts)),
        "splits": MetadataValue.int(sum(c.splits for c in counts)),
        "splits_completed": MetadataValue.int(sum(c.splits_completed for c in counts)),
        "by_partition": MetadataValue.md(_counts_table(counts)),
    }
    description = None
    if failed:
        metadata["failed_partitions"] = _days_text([c.day for c in failed])
        description = "; ".join(
            f"{c.day}: {c.rows_out} rows out, expected {c.rows_in - c.dead_letters}"
            + (
                f", {c.splits - c.splits_completed} of {c.splits} splits not completed"
                if c.splits_completed != c.splits
                else ""
            )
            for c in failed
        )
    return AssetCheckResult(passed=not failed, metadata=metadata, description=description)


@asset_check(asset=enriched_events, blocking=False)
def dead_letter_ratio(
    context: AssetCheckExecutionContext, sluice: SluiceResource
) -> AssetCheckResult:
    """Dead letters are at most ``max_dead_letter_ratio`` of every partition's records."""
    settings = sluice.settings()
    days = checked_days(context)
    skipped = _not_applicable(settings, days)
    if skipped is not None:
        return skipped
    counts = partition_counts(settings, days)
    limit = sluice.max_dead_letter_ratio
    failed = [c for c in counts if c.dead_letter_ratio > limit]
    worst = max(counts, key=lambda c: c.dead_letter_ratio)
    rows_in = sum(c.rows_in for c in counts)
    dead = sum(c.dead_letters for c in counts)
    metadata: dict[str, Any] = {
        "partitions": _days_text(days),
        "max_dead_letter_ratio": MetadataValue.float(limit),
        "dead_letter_ratio": MetadataValue.float(dead / rows_in if rows_in else 0.0),
        "worst_partition": MetadataValue.text(worst.day.isoformat()),
        "worst_ratio": MetadataValue.float(worst.dead_letter_ratio),
        "dead_letters": MetadataValue.int(dead),
        "rows_in": MetadataValue.int(rows_in),
    }
    if failed:
        metadata["failed_partitions"] = _days_text([c.day for c in failed])
    return AssetCheckResult(
        passed=not failed,
        severity=AssetCheckSeverity.WARN,
        metadata=metadata,
        description=(
            f"{worst.day}: {worst.dead_letter_ratio:.2%} dead letters (limit {limit:.2%})"
            if failed
            else None
        ),
    )


#: Every check of enriched_events, for the Definitions.
enriched_events_checks = [no_duplicate_event_ids, rows_reconcile, dead_letter_ratio]
