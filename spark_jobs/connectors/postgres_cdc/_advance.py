"""The stream reader's slot advance: the slot is advanced only to the offset completed
checkpoints committed, by the reader's own status updates while it streams.

Every second (bounded: 5 s) between two transactions, the reader reads its split's
``committed_offset`` back (lowered to the start of any range still ``pending`` in the async
operator, which a restore re-reads from the slot) and, when it moved, the receive thread sends
it as the flushed position of a status update (``Receiver.confirm``). (Stopping the stream to
advance the idle slot instead made the walsender decode again, from the restart point, all it
had sent past the offset: a continuous run fell behind.) The connection runs with the
largest ``wal_sender_timeout`` (``_replication.WAL_SENDER_TIMEOUT_MS``: the server sends
keepalives between whole transactions only — in the middle of one only after 12 days without
a status update, and the receive thread sends one at least every minute) and no periodic
status updates of psycopg2's own. psycopg2 forwards its flush to a
keepalive's WAL end when it was given one at or past the last message's start, and before the
first message always: the receiver keeps what it sends below that start, and the reader
confirms nothing below its stream's first transaction or marker (the *floor*: a keepalive
before it reported nothing past it), so the slot never passes the committed offset.

The offsets are Sluice's records, in the platform database — not necessarily the database
the slot is in (``PostgresCdcSource(url_env)``).

Threading: used on the stream reader's fetcher thread only; blocks on the platform database.
"""

from __future__ import annotations

from typing import Any, Protocol

import psycopg

from spark_jobs.connectors.postgres_cdc._source_db import connect_patiently

__all__ = ["CommittedOffsets", "SlotConfirmer", "committed_offset"]

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


class _Confirms(Protocol):
    def confirm(self, lsn: int) -> None: ...


class SlotConfirmer:
    """When and what the stream reader confirms to the server (see the module docstring):
    ``committed`` read every ``every`` seconds, never below the open stream's floor."""

    def __init__(self, committed: CommittedOffsets, every: float) -> None:
        self._committed = committed
        self._every = every
        self._next = 0.0
        self._confirmed = 0  # the last committed offset handed to the receiver
        self._floor: int | None = None

    def restart(self, now: float) -> None:
        """A new read: the first look ``every`` seconds from ``now``."""
        self._next = now + self._every
        self._confirmed = 0
        self._floor = None

    def new_stream(self) -> None:
        """The stream (re)started: nothing is confirmed until it passes a transaction or a
        marker."""
        self._floor = None

    def passed(self, position: int) -> None:
        """The stream passed a transaction or a marker; ``position``: the reader's offset."""
        if self._floor is None:
            self._floor = position

    def maybe_confirm(self, now: float, split_id: int, receiver: _Confirms) -> None:
        """Between transactions, every ``every`` seconds: have ``receiver`` confirm the
        split's committed offset when it moved (the stream goes on)."""
        if now < self._next or self._floor is None:
            return
        self._next = now + self._every
        flush = self._committed.of(split_id)
        if flush is None or flush <= self._confirmed or flush < self._floor:
            return
        receiver.confirm(flush)
        self._confirmed = flush

    def close(self) -> None:
        self._committed.close()
