"""How a run rides out database outages (a restart, dropped connections).

Lookups retry connection-level failures with backoff (``is_transient`` is their retry
predicate); a new task attempt waits for the database to come back before giving up
(``connect_when_up``). Anything else fails the attempt and Spark retries it; checkpoints make
the retry resume from committed state.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import TypeVar

import asyncpg
import psycopg
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from enumerator_service import Backoff, ConfigError, ServerUnreachable, connect_engine

__all__ = [
    "connect_when_up",
    "connection_lost",
    "coordinator_failed",
    "is_transient",
    "while_down",
]

_log = logging.getLogger(__name__)
_T = TypeVar("_T")


def is_transient(error: BaseException) -> bool:
    """Connection-level failures worth retrying; SQL errors (a missing table …) are not."""
    return isinstance(error, (OSError, *_TRANSIENT))


#: SQLSTATEs of a server going away: connection exceptions (class 08), and the shutdowns
#: (admin, crash) and start-up that end or refuse a session.
_GONE_STATES = ("57P01", "57P02", "57P03")


def connection_lost(error: BaseException) -> bool:
    """A database error that is the connection's loss (the server stopped, restarted or
    cannot be reached) rather than a statement's failure: a DBAPI error (or SQLAlchemy's
    wrapper of one) without a SQLSTATE — the client's own ("connection is bad", "server
    closed the connection unexpectedly") — or of class 08 or a shutdown. A full disk, a
    serialization failure or a refused constraint are not (they have a server's SQLSTATE)."""
    cause = getattr(error, "orig", None) if isinstance(error, sa.exc.DBAPIError) else error
    if not isinstance(cause, psycopg.OperationalError | psycopg.InterfaceError):
        return False
    state = cause.sqlstate
    return state is None or state.startswith("08") or state in _GONE_STATES


_TRANSIENT = (
    asyncpg.exceptions.ConnectionDoesNotExistError,
    asyncpg.exceptions.CannotConnectNowError,
    asyncpg.exceptions.TooManyConnectionsError,
    asyncpg.exceptions.InterfaceError,
)


#: How long an attempt waits for an unreachable database before it fails.
_CONNECT_PATIENCE = 30.0


async def connect_when_up(url: str) -> Engine:
    """``connect_engine``, waiting out a database restart: Spark retries a failed task at
    once, so attempts that fail to connect would use up every retry during a short outage."""
    backoff = Backoff(_CONNECT_PATIENCE)
    while True:
        try:
            return connect_engine(url, pool_size=2)
        except ConfigError:
            delay = backoff.next_delay()
            if delay is None:
                raise
            await asyncio.sleep(delay)


def while_down(step: Callable[[], _T], patience: float = 60.0) -> _T:
    """``step``, retried while the database is unreachable (a restart), for ``patience`` s:
    the driver's wrap-up after a committed run waits out a restart instead of failing."""
    backoff = Backoff(patience, first=0.2, cap=5.0)
    while True:
        try:
            return step()
        except (sa.exc.OperationalError, sa.exc.InterfaceError) as exc:
            delay = backoff.next_delay()
            if delay is None:
                raise
            _log.warning("database unavailable, retrying in %.1fs: %s", delay, exc)
            time.sleep(delay)


def coordinator_failed(error: BaseException) -> Exception:
    """The run's error when its checkpoint coordinator gave up: the first line of the cause
    (a database error's, without the SQL statement SQLAlchemy appends). The platform
    database's connection lost (stopped, restarted past the coordinator's patience) is an
    outage naming its setting (``sluice: unreachable: SLUICE_DATABASE_URL: …``, exit code 1):
    run again once it is back."""
    cause = getattr(error, "orig", None) or error
    first = next(iter(str(cause).strip().splitlines()), type(cause).__name__)
    if connection_lost(error):
        return ServerUnreachable(
            "SLUICE_DATABASE_URL",
            f"the platform database stopped answering during the run ({first}); run it"
            " again once the database is back (committed output is kept)",
        )
    return RuntimeError(f"checkpoint coordinator failed: {first}")
