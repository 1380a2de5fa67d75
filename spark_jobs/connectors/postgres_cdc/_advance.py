"""The stream reader's slot advance: the offset completed checkpoints committed, and the
advance of a slot its reader has just left (see ``_stream``: the slot is advanced only to
what completed checkpoints committed, never by the replication connection itself).

Threading: functions of the stream reader's fetcher thread, on its own SQL connection.
"""

from __future__ import annotations

import time
from typing import Any

import psycopg

from spark_jobs.connectors.postgres_cdc._slot import SlotMissingError, lsn_text

__all__ = ["advance_left_slot", "committed_offset", "confirmed_flush"]

_COMMITTED = "SELECT committed_offset, pending FROM sluice.splits WHERE id = %s"
_CONFIRMED = "SELECT confirmed_flush_lsn - '0/0' FROM pg_replication_slots WHERE slot_name = %s"
_ADVANCE = "SELECT pg_replication_slot_advance(%s, CAST(%s AS pg_lsn))"


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


def confirmed_flush(sql: psycopg.Connection[Any], slot: str) -> int | None:
    """The slot's confirmed position (None: not set); raises when the slot is gone."""
    row = sql.execute(_CONFIRMED, (slot,)).fetchone()
    if row is None:
        raise SlotMissingError(
            f"replication slot {slot!r} was dropped while it was read (by an admin?)"
        )
    return None if row[0] is None else int(row[0])


def advance_left_slot(sql: psycopg.Connection[Any], slot: str, flush: int) -> None:
    """Advance ``slot`` to ``flush`` once the walsender its reader just closed released it."""
    for _ in range(50):
        try:
            sql.execute(_ADVANCE, (slot, lsn_text(flush)))
            return
        except psycopg.errors.ObjectInUse:
            time.sleep(0.05)
    raise RuntimeError(f"replication slot {slot!r} stays active after its reader left")
