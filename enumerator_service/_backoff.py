"""Waiting for a server that does not answer (a restart): one policy for every such wait.

Each connect-and-wait loop — a CDC reader's replication connection, a lookup pool's
connection, a task attempt's platform engine, the driver's wrap-up — tries, and on a "down"
error asks its :class:`Backoff` how long to sleep before the next try; ``None`` means the
patience is spent and the loop raises its own one-line error. What counts as "down" stays
with each loop: it depends on the client (psycopg, asyncpg, SQLAlchemy).

Threading: a ``Backoff`` belongs to one wait on one thread (or task); it never sleeps itself,
so sync loops sleep with ``time.sleep`` and async ones with ``asyncio.sleep``.
"""

from __future__ import annotations

import time
from collections.abc import Callable

__all__ = ["Backoff"]


class Backoff:
    """The delays of one wait: ``first`` s, doubled after each one up to ``cap``, as long as
    the next delay still ends within ``patience`` s of the wait's start. ``clock``: a
    monotonic clock in seconds (a virtual one in tests)."""

    def __init__(
        self,
        patience: float,
        *,
        first: float = 0.1,
        cap: float = 2.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._clock = clock
        self._deadline = clock() + patience
        self._delay = first
        self._cap = cap

    def next_delay(self) -> float | None:
        """How long to wait before trying again, or None: give up now (the patience is
        spent, or the next delay would end past it)."""
        delay = self._delay
        if self._clock() + delay > self._deadline:
            return None
        self._delay = min(2 * delay, self._cap)
        return delay
