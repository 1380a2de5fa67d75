"""Row accounting of a pipeline's output, per partition (day), for its asset checks.

Where the numbers come from, per day D of pipeline P:

- rows out: what the output holds — rows in the Parquet files of ``<output>/dt=D`` (their
  footers; no data is read), or ``count(*)`` of the sink table's rows with ``dt = D``;
- rows committed: rows of P's committed sink transactions that belong to D's *current*
  generation — Parquet files published into ``dt=D`` since D's latest rebuild was swapped in
  (all of them without a rebuild), or by that rebuild; for a table sink the transactions'
  per-day counts. Summed over every run that committed them;
- dead letters: rows of ``sluice.dead_letters`` of the splits registered for D;
- splits: how many splits D has, and how many are completed.

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

from dagster_project._runs import parquet_objects
from enumerator_service import Location, Settings
from enumerator_service._operations import open_platform
from enumerator_service._schema import SplitStatus, dead_letters, splits
from spark_jobs.pipeline import Pipeline
from spark_jobs.pipeline._errors import quote
from spark_jobs.pipeline._paths import output_root

__all__ = ["PartitionCounts", "partition_counts", "partition_folder"]


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


def partition_folder(pipeline: Pipeline, settings: Settings, day: date | None) -> Location:
    """The folder of ``day``'s output (a local folder or an object-store prefix)."""
    root = output_root(pipeline, settings)
    return root if day is None else root.child(f"dt={day.isoformat()}")


# Rows committed into each day's *current* generation (see the module docstring).
_PARQUET_ROWS = """
WITH files AS (
    SELECT t.committed_at, f.value ->> 'final' AS final, CAST(f.value ->> 'rows' AS bigint) AS rows
    FROM sluice.sink_transactions AS t, jsonb_array_elements(t.staged) AS f(value)
    WHERE t.committed AND t.sink = 'parquet' AND t.source = :source
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
_ALL_PARQUET_ROWS = """
SELECT COALESCE(SUM(t.row_count), 0) FROM sluice.sink_transactions AS t
WHERE t.committed AND t.sink = 'parquet' AND t.source = :source
"""
_TABLE_ROWS = """
SELECT f.value -> 'rows_by_partition' AS days, CAST(f.value ->> 'rows' AS bigint) AS rows
FROM sluice.sink_transactions AS t, jsonb_array_elements(t.staged) AS f(value)
WHERE t.committed AND t.sink = 'postgres' AND t.source = :source
"""


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
                        sa.func.count(),
                        sa.func.count().filter(splits.c.status == SplitStatus.COMPLETED),
                    )
                    .where(*of_source)
                    .group_by(by_day)
                )
            }
            dead = {
                key: int(n)
                for key, n in conn.execute(
                    sa.select(by_day, sa.func.count())
                    .select_from(dead_letters.join(splits, dead_letters.c.split_id == splits.c.id))
                    .where(*of_source)
                    .group_by(by_day)
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
    source = pipeline.name
    if pipeline.plan.sink.kind == "postgres":
        found: dict[date | None, int] = {}
        for per_day, rows in conn.execute(sa.text(_TABLE_ROWS), {"source": source}):
            if not days:
                found[None] = found.get(None, 0) + int(rows)
                continue
            for key, count in (per_day or {}).items():
                day = date.fromisoformat(key)
                found[day] = found.get(day, 0) + int(count)
        return found
    if not days:
        total = conn.execute(sa.text(_ALL_PARQUET_ROWS), {"source": source}).scalar_one()
        return {None: int(total)}
    query = sa.text(_PARQUET_ROWS).bindparams(sa.bindparam("days", type_=sa.ARRAY(sa.Date)))
    params = {
        "source": source,
        "days": days,
        # The prefix of the entries' "final" names: a local path or the table's URI.
        "root": f"{output_root(pipeline, settings).uri}/",
    }
    return {day: int(rows) for day, rows in conn.execute(query, params)}


def _rows_out(
    conn: sa.Connection, pipeline: Pipeline, settings: Settings, days: Sequence[date | None]
) -> dict[date | None, int]:
    sink = pipeline.plan.sink
    if sink.kind == "postgres":
        assert sink.table is not None
        table = f"{quote(sink.table[0])}.{quote(sink.table[1])}"
        exists = conn.execute(sa.text("SELECT to_regclass(:t)"), {"t": table}).scalar()
        out: dict[date | None, int] = {}
        for day in days:
            if exists is None:
                out[day] = 0
            elif day is None:
                out[day] = int(conn.execute(sa.text(f"SELECT count(*) FROM {table}")).scalar_one())
            else:
                query = sa.text(f"SELECT count(*) FROM {table} WHERE dt = :day")
                out[day] = int(conn.execute(query, {"day": day}).scalar_one())
        return out
    import pyarrow.parquet as pq

    found: dict[date | None, int] = {}
    for day in days:
        folder = partition_folder(pipeline, settings, day)
        found[day] = sum(
            pq.read_metadata(path, filesystem=folder.fs).num_rows
            for path in parquet_objects(folder)
        )
    return found
