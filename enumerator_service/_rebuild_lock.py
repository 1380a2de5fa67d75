"""The per-source lock that orders split registration against partition rebuilds."""

from __future__ import annotations

from datetime import date

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from enumerator_service._schema import RebuildStatus, partition_rebuilds

__all__ = ["ACTIVE_REBUILD", "holds", "lock_rebuilds"]

#: Rebuild statuses during which new splits of the partition are held back.
ACTIVE_REBUILD = (RebuildStatus.BUILDING, RebuildStatus.SWAPPING)


def lock_rebuilds(conn: Connection, source: str, *, shared: bool = False) -> None:
    """Take the source's rebuild lock until the caller's transaction ends.

    Registrations take it shared (they run concurrently); starting a rebuild and each step of
    its swap take it exclusive, so a split registered concurrently is either HELD by the
    rebuild or registered after the swap released the partition — never in between.
    """
    function = "pg_advisory_xact_lock_shared" if shared else "pg_advisory_xact_lock"
    conn.execute(
        sa.text(f"SELECT {function}(hashtextextended(:key, 0))"),
        {"key": f"sluice.rebuild:{source}"},
    )


def holds(source: sa.ColumnElement[str], partition_key: sa.ColumnElement[date]) -> sa.Exists:
    """Whether an unfinished rebuild holds back a split of ``source`` landing on
    ``partition_key``: a rebuild of that day, or any rebuild by event day of the source (any
    file may carry rows of the day being rebuilt; they join after the swap)."""
    table = partition_rebuilds
    return sa.exists().where(
        table.c.source == source,
        table.c.status.in_(ACTIVE_REBUILD),
        sa.or_(table.c.partition_key == partition_key, table.c.event_days),
    )
