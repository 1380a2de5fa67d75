"""The per-source lock that orders split registration against partition rebuilds."""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from enumerator_service._schema import RebuildStatus

__all__ = ["ACTIVE_REBUILD", "lock_rebuilds"]

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
