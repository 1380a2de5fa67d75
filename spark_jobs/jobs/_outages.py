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
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from enumerator_service import Backoff, ConfigError, connect_engine

__all__ = ["connect_when_up", "is_transient", "while_down"]

_log = logging.getLogger(__name__)
_T = TypeVar("_T")


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
