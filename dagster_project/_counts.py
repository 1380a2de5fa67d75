"""Row accounting of a pipeline's output, per partition (day), for its asset checks.

Where the numbers come from, per day D of pipeline P:

- rows out: what the output holds — rows in the Parquet files of ``<output>/dt=D`` (their
  footers; no data is read), or ``count(*)`` of the sink table's rows with ``dt = D``;
- rows committed: rows of P's committed sink transactions that belong to D's *current*
  generation — Parquet files published into ``dt=D`` since D's latest rebuild was swapped in
  (all of them without a rebuild), or by that rebuild; for a table sink the transactions'
  per-day counts. Summed over every run that committed them;
- dead letters: rows of ``sluice.dead_letters`` of P counted on D — their own day (the
  day the commit tagged them with: a step's, its record's event day; a reader's, its
  landing day, or a Kafka main line's message timestamp day), else, untagged, their split's
  day;
- splits: how many bounded splits D has, and how many are completed (an unbounded one —
  a change stream — never completes).

``rows out == rows committed`` (with every split completed) says that the output holds
exactly what the platform committed: a lost, duplicated or stray file or row breaks it.
An upsert sink merges rows by key, so the equality does not apply to it.
An unpartitioned output is one partition (``day`` None).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import date

import sqlalchemy as sa

from enumerator_service import (
    STREAM_KINDS,
    Settings,
    SplitStatus,
    dead_letters,
    open_platform,
    splits,
)
from spark_jobs.connectors import sink_connector_named
from spark_jobs.pipeline import Pipeline

__all__ = ["PartitionCounts", "partition_counts"]


@dataclass(frozen=True, slots=True)
class PartitionCounts:
    day: date | None
    rows_out: int
    rows_committed: int
    dead_letters: int
    splits: int
    splits_completed: int
    #: False for an upsert sink (rows merge by key).
    comparable: bool = True

    @property
    def rows_in(self) -> int:
        """Records that reached the sink or the dead letters."""
        return self.rows_committed + self.dead_letters

    @property
    def dead_letter_ratio(self) -> float:
        return self.dead_letters / self.rows_in if self.rows_in else 0.0

    @property
    def reconciles(self) -> bool:
        done = self.splits_completed == self.splits
        return done and (not self.comparable or self.rows_out == self.rows_committed)


def partition_counts(
    pipeline: Pipeline, settings: Settings, days: Sequence[date | None]
) -> list[PartitionCounts]:
    """The accounting of ``days`` (``[None]`` for an unpartitioned output)."""
    source = pipeline.name
    partitioned = [day for day in days if day is not None]
    # Reads the sluice schema: checked, never migrated (a check is not a run start).
    engine = open_platform(settings, migrate=False, pool_size=1).engine
    try:
        with engine.connect() as conn:
            committed = _committed(conn, pipeline, settings, partitioned)
            rows_out = _rows_out(conn, pipeline, settings, days)
            by_day = splits.c.partition_key if partitioned else sa.literal(None)
            of_source = [splits.c.source == source]
            if partitioned:
                of_source.append(splits.c.partition_key.in_(partitioned))
            split_counts = {
                key: (int(n), int(done))
                for key, n, done in conn.execute(
                    sa.select(
                        by_day,
                        # An older version's split of a changed file is never read: not one
                        # the day waits for.
                        sa.func.count().filter(splits.c.status != SplitStatus.SUPERSEDED),
                        sa.func.count().filter(splits.c.status == SplitStatus.COMPLETED),
                    )
                    # An unbounded split (a change stream a continuous run follows) never
                    # completes: not one the output waits for.
                    .where(
                        *of_source,
                        sa.or_(
                            splits.c.end_offset.is_not(None),
                            splits.c.kind.not_in(sorted(STREAM_KINDS)),
                        ),
                    )
                    .group_by(by_day)
                )
            }
            dead_day = (
                sa.func.coalesce(dead_letters.c.partition_key, splits.c.partition_key)
                if partitioned
                else sa.literal(None)
            )
            dead_of = [splits.c.source == source]
            if partitioned:
                dead_of.append(dead_day.in_(partitioned))
            dead = {
                key: int(n)
                for key, n in conn.execute(
                    sa.select(dead_day, sa.func.count())
                    .select_from(dead_letters.join(splits, dead_letters.c.split_id == splits.c.id))
                    .where(*dead_of)
                    .group_by(dead_day)
                )
            }
    finally:
        engine.dispose()
    comparable = pipeline.plan.sink.upsert_key is None
    counts = []
    for day in days:
        total, done = split_counts.get(day, (0, 0))
        counts.append(
            PartitionCounts(
                day, rows_out[day], committed.get(day, 0), dead.get(day, 0), total, done, comparable
            )
        )
    return counts


def _committed(
    conn: sa.Connection, pipeline: Pipeline, settings: Settings, days: list[date]
) -> dict[date | None, int]:
    connector = sink_connector_named(pipeline.plan.sink.kind)
    return connector.committed_rows(conn, pipeline, settings, days)


def _rows_out(
    conn: sa.Connection, pipeline: Pipeline, settings: Settings, days: Sequence[date | None]
) -> dict[date | None, int]:
    connector = sink_connector_named(pipeline.plan.sink.kind)
    return connector.rows_out(conn, pipeline, settings, days)
