"""Position markers of a CDC stream: logical decoding messages the reader writes into the
source's WAL (``pg_logical_emit_message``, non-transactional, prefix :data:`MARKER_PREFIX`).

The walsender sends a non-transactional message as soon as it decodes it, after every
transaction that committed before the message's LSN and before every one that commits after.
So a marker coming back through the stream proves two things:

- **position**: the stream has passed every commit before the marker's LSN (a bounded read
  ends at the one it wrote when it opened; a continuous read's offset moves on while its
  tables are quiet, so the slot advances);
- **time** (a heartbeat, as Flink CDC's and Debezium's): the marker carries the source
  server's clock when it was written (epoch microseconds), the clock commit times are taken
  from, so every commit still to come is of that time or later — a caught-up reader's
  watermark can advance to it on a quiet table instead of stopping at the last commit it
  read. (A commit can take its time just before the marker and write its record just
  after: microseconds, well inside the source's ``out_of_orderness``; such a record is
  late, not lost: ``late_records`` applies.)

Threading: functions of the caller's thread; :func:`write_marker` blocks on the server.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from spark_jobs.connectors.postgres_cdc._pgoutput import Marker

__all__ = ["MARKER_PREFIX", "marker_time", "write_marker"]

MARKER_PREFIX = "sluice-cdc"

#: The marker's content is the server clock, read before the message is written.
_WRITE = (
    "SELECT pg_logical_emit_message(false, %s,"
    " (extract(epoch FROM clock_timestamp()) * 1000000)::bigint::text) - '0/0'"
)
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def write_marker(conn: Any) -> int:
    """Write a marker on ``conn`` (a psycopg connection in autocommit); returns its LSN."""
    row = conn.execute(_WRITE, (MARKER_PREFIX,)).fetchone()
    assert row is not None
    return int(row[0])


def marker_time(message: Marker) -> datetime | None:
    """The server time a Sluice marker carries (UTC), or None: a transactional message,
    another prefix, or a marker without a time (written by an older version or by hand)."""
    if message.transactional or message.prefix != MARKER_PREFIX:
        return None
    content = message.content
    if not content.isdigit() or len(content) > 18:
        return None
    return _EPOCH + timedelta(microseconds=int(content))
