"""Row accounting of a Delta sink for the Dagster checks.

``committed_rows``: what the platform committed, from the committed transactions' file
lists in Postgres (each day's current generation: files committed since its latest rebuild
was swapped in, or that rebuild's files in ``dt=D/rebuild-<r>/`` — the Parquet sink's
rule). ``rows_out``: what the table's current version holds, from its add actions'
``numRecords`` (no data read). ``duplicate_keys``: the key columns of one day read through
delta-rs.

Threading: blocking database and store calls; the caller's thread.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import date

import pyarrow.compute as pc
import sqlalchemy as sa

from enumerator_service import Location
from spark_jobs.connectors._committed_rows import DayFiles, committed_day_rows
from spark_jobs.connectors.delta._paths import delta_storage, table_uri
from spark_jobs.connectors.delta._table import add_actions, load_table

__all__ = ["committed_rows", "duplicate_keys", "rows_out"]

#: Duplicated keys listed in a failed check's metadata.
_SAMPLE_KEYS = 5

#: The Delta sink's files of a day (``<root>dt=D/``) and of its rebuild ``l.id``.
_DAY_FILES = DayFiles(
    live="starts_with(files.final, :root || 'dt=' || w.day || '/')"
    " AND NOT starts_with(files.final, :root || 'dt=' || w.day || '/rebuild-')",
    rebuilt="starts_with(files.final, :root || 'dt=' || w.day || '/rebuild-' || l.id || '/')",
)


def committed_rows(
    conn: sa.Connection, source: str, table: Location, days: list[date]
) -> dict[date | None, int]:
    root = f"{table.uri.rstrip('/')}/"
    return committed_day_rows(
        conn, sink="delta", source=source, days=days, files=_DAY_FILES, root=root
    )


def rows_out(
    table: Location, partition: str | None, days: Sequence[date | None]
) -> dict[date | None, int]:
    delta = load_table(table_uri(table), delta_storage(table))
    if delta is None:
        return dict.fromkeys(days, 0)
    actions = add_actions(delta)
    counts = actions.column("num_records").to_pylist()
    found: dict[date | None, int] = {}
    for day in days:
        if day is None or partition is None:
            found[day] = sum(int(n or 0) for n in counts)
            continue
        values = actions.column(f"partition.{partition}").to_pylist()
        found[day] = sum(int(n or 0) for n, v in zip(counts, values, strict=True) if v == day)
    return found


def duplicate_keys(
    table: Location, partition: str | None, day: date | None, key: list[str]
) -> tuple[int, list[str]]:
    delta = load_table(table_uri(table), delta_storage(table))
    if delta is None:
        return 0, []
    filters = None
    if day is not None and partition is not None:
        filters = [(partition, "=", day.isoformat())]
    rows = delta.to_pyarrow_table(partitions=filters, columns=key)
    if rows.num_rows == 0:
        return 0, []
    counts = rows.group_by(key).aggregate([([], "count_all")])
    repeated = counts.filter(pc.greater(counts.column("count_all"), 1))
    sample = repeated.select(key).slice(0, _SAMPLE_KEYS).to_pylist()
    return rows.num_rows - counts.num_rows, [str(tuple(row.values())) for row in sample]
