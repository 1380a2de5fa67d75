"""One lock per lakehouse table, held by everything that commits to it.

A table format's own optimistic concurrency keeps a commit from being lost when two writers
race, but not Sluice's rules that go beyond one commit: the committer's "is this checkpoint
in the table's history already?" check and its commit must not interleave with a recovery of
the same run in another process, and a maintenance job (compaction, snapshot expiry) must
never replace a day's files while a commit of that day is between its check and its commit.
So the committers (checkpoint publish, rebuild overwrite) and the maintenance jobs take this
session-level Postgres advisory lock around their work. Writers outside Sluice do not take
it: against them the format's conflict detection and retry is the protection.

A holder that dies frees the lock when Postgres notices its connection is gone: at once on a
Unix socket or a connection its kernel closed (a killed process), but a holder whose host
vanished sends no FIN, and the server's TCP keepalives default to the OS's two hours and
more — every committer of the table would wait that long. So the lock's session sets its
own server-side keepalives (``_KEEPALIVES``: about a minute). The waiting side is bounded
by the client keepalives of ``connect_engine`` (a server that vanished).

Threading: blocks on the database; call from the coordinator, a recovery or a job thread.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import sqlalchemy as sa
from sqlalchemy.engine import Engine

__all__ = ["table_lock"]

#: Server-side TCP keepalives of the lock's session (seconds; ignored on a Unix socket): a
#: holder that stopped answering is dropped, and its lock freed, after 20 + 5 * 4 s.
_KEEPALIVES = (
    ("tcp_keepalives_idle", "20"),
    ("tcp_keepalives_interval", "5"),
    ("tcp_keepalives_count", "4"),
)


@contextlib.contextmanager
def table_lock(engine: Engine, table: str) -> Iterator[None]:
    """Hold the advisory lock of ``table`` (a catalog identifier or a table URI) for the
    block; released when the block ends or when the process dies with its connection."""
    key = {"key": f"sluice.table:{table}"}
    with engine.connect() as conn:
        for name, value in _KEEPALIVES:  # (session-wide: harmless on the pooled connection)
            conn.execute(sa.select(sa.func.set_config(name, value, False)))
        conn.execute(sa.text("SELECT pg_advisory_lock(hashtextextended(:key, 0))"), key)
        conn.commit()
        try:
            yield
        finally:
            conn.execute(sa.text("SELECT pg_advisory_unlock(hashtextextended(:key, 0))"), key)
            conn.commit()
