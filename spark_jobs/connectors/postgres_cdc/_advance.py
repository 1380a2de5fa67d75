"""The stream reader's slot advance: the offset completed checkpoints committed (see
``_stream``: the slot is advanced only to it, by the reader's own status updates).

The offsets are Sluice's records, in the platform database — not necessarily the database
the slot is in (``PostgresCdcSource(url_env)``).

Threading: used on the stream reader's fetcher thread only; blocks on the platform database.
"""

from __future__ import annotations

from typing import Any

import psycopg

from spark_jobs.connectors.postgres_cdc._source_db import connect_patiently

__all__ = ["CommittedOffsets", "committed_offset"]

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


class CommittedOffsets:
    """``committed_offset`` of the splits, on a connection of its own to the platform
    database (``dsn``), opened at the first question and kept until ``close``."""

    def __init__(self, dsn: str) -> None:
        self._dsn = dsn
        self._sql: psycopg.Connection[Any] | None = None

    def of(self, split_id: int) -> int | None:
        if self._sql is None:
            dsn = self._dsn
            self._sql = connect_patiently(
                lambda: psycopg.connect(dsn, autocommit=True, application_name="sluice-cdc"), dsn
            )
        return committed_offset(self._sql, split_id)

    def close(self) -> None:
        if self._sql is not None:
            self._sql.close()
            self._sql = None
