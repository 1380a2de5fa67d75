"""The stream reader's slot advance: the offset completed checkpoints committed (see
``_stream``: the slot is advanced only to it, by the reader's own status updates).

Threading: functions of the stream reader's fetcher thread, on its own SQL connection.
"""

from __future__ import annotations

from typing import Any

import psycopg

__all__ = ["committed_offset"]

_COMMITTED = "SELECT committed_offset, pending FROM sluice.splits WHERE id = %s"


def committed_offset(sql: psycopg.Connection[Any], split_id: int) -> int | None:
    """The split's committed offset, lowered to its pending ranges' starts (a restore
    re-reads those from the slot)."""
    row = sql.execute(_COMMITTED, (split_id,)).fetchone()
    if row is None or row[0] is None:
        return None
    flush = int(row[0])
    for entry in row[1] or ():
        span = entry.get("span") if isinstance(entry, dict) else None
        if span:
            flush = min(flush, int(span[0]))
    return flush
