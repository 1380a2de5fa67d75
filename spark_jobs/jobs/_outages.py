"""How a reader subtask rides out database outages (a restart, dropped connections).

Lookups retry connection-level failures with backoff (``is_transient`` is their retry
predicate); a new task attempt waits for the database to come back before giving up
(``connect_when_up``). Anything else fails the attempt and Spark retries it; checkpoints make
the retry resume from committed state.
"""

from __future__ import annotations

import asyncio
import time

import asyncpg
from sqlalchemy.engine import Engine

from enumerator_service import ConfigError, connect_engine

__all__ = ["connect_when_up", "is_transient"]


def is_transient(error: BaseException) -> bool:
    """Connection-level failures worth retrying; SQL errors (a missing table …) are not."""
    return isinstance(error, (OSError, *_TRANSIENT))


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
    deadline = time.monotonic() + _CONNECT_PATIENCE
    delay = 0.1
    while True:
        try:
            return connect_engine(url, pool_size=2)
        except ConfigError:
            if time.monotonic() + delay > deadline:
                raise
            await asyncio.sleep(delay)
            delay = min(2 * delay, 2.0)
