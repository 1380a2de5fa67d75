"""Rows a file sink committed into each output day's *current* generation, from the
checkpoint store alone (``sink_transactions``; no data is read): the files committed into
day D since D's latest rebuild went live (all of them without a rebuild), plus that
rebuild's own files. Dagster's row-count checks compare it with what the table holds.

Each file sink names its files its own way, so it passes the two SQL predicates over
``files.final`` (the committed file's name), ``w.day`` (the day), ``l.id`` (the latest
rebuild's id) and its own bind parameters: :class:`DayFiles`. They are constants of the
connectors, never user input.

Threading: runs on the caller's connection.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date
from typing import Any

import sqlalchemy as sa

__all__ = ["DayFiles", "committed_day_rows"]

_DAY_ROWS = """
WITH files AS (
    SELECT t.committed_at, f.value ->> 'final' AS final, CAST(f.value ->> 'rows' AS bigint) AS rows
    FROM sluice.sink_transactions AS t, jsonb_array_elements(t.staged) AS f(value)
    WHERE t.committed AND t.sink = :sink AND t.source = :source
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
    ({live}) AND (l.swapped_at IS NULL OR files.committed_at > l.swapped_at)
) OR (
    l.id IS NOT NULL AND ({rebuilt})
)
GROUP BY w.day
"""
_ALL_ROWS = """
SELECT COALESCE(SUM(t.row_count), 0) FROM sluice.sink_transactions AS t
WHERE t.committed AND t.sink = :sink AND t.source = :source
"""


@dataclass(frozen=True, slots=True)
class DayFiles:
    """How a sink's committed files of day ``w.day`` are recognised by name: ``live``, a
    file of the day itself; ``rebuilt``, a file of the day's rebuild ``l.id``."""

    live: str
    rebuilt: str


def committed_day_rows(
    conn: sa.Connection,
    *,
    sink: str,
    source: str,
    days: list[date],
    files: DayFiles,
    **params: Any,
) -> dict[date | None, int]:
    """Rows committed per day of ``days`` (days without any left out); with no days, the
    total of the source under the key None. ``params``: the predicates' own parameters."""
    if not days:
        total = conn.execute(sa.text(_ALL_ROWS), {"sink": sink, "source": source}).scalar_one()
        return {None: int(total)}
    query = sa.text(_DAY_ROWS.format(live=files.live, rebuilt=files.rebuilt)).bindparams(
        sa.bindparam("days", type_=sa.ARRAY(sa.Date))
    )
    bound = {"sink": sink, "source": source, "days": days, **params}
    return {day: int(rows) for day, rows in conn.execute(query, bound)}
