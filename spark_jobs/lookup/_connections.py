"""A minimal asyncpg connection pool for lookups, one per (process, event loop, DSN).

asyncpg's own Pool resets every connection on release (a second round trip) and shields a
task per release; together that doubled the cost of a per-row lookup. Lookups never change
session state and bound their own concurrency, so a free list is all they need.

Opening a connection waits out a database that does not answer (a restart, a failover) for
up to ``CONNECT_PATIENCE`` s, as the source readers do: Spark retries a failed task at once,
so a lookup failing at the first refused connection lost the run to a ten-second restart.
A server that refuses the user or the password is not waited for. Past the patience, one
:class:`DatabaseUnreachable` names the database (its URL without the password) and ``where``
(the setting and variable it came from); it is not a transient error, so the lookup fails
with that line instead of retrying into its timeout.

Threading: event-loop thread only. asyncpg connections belong to the loop that opened them.
"""

from __future__ import annotations

import asyncio
import os
from collections import deque
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import asyncpg

from enumerator_service import Backoff, redact_text, redact_url

__all__ = [
    "CONNECT_PATIENCE",
    "ConnectionPool",
    "DatabaseUnreachable",
    "acquire_pool",
    "release_pool",
]

#: Seconds opening a connection waits for a database that does not answer to come back.
CONNECT_PATIENCE = 30.0
#: What a database that is down, starting or full answers (anything else is not waited for).
_DOWN = (
    OSError,  # refused, reset, no such socket, timed out
    asyncpg.CannotConnectNowError,  # starting up, shutting down
    asyncpg.TooManyConnectionsError,
    asyncpg.ConnectionDoesNotExistError,
)


class DatabaseUnreachable(RuntimeError):
    """A lookup's database did not answer for the whole patience (one line: see above)."""


async def _connect_patiently(dsn: str, where: str, patience: float) -> asyncpg.Connection:
    backoff = Backoff(patience, clock=asyncio.get_running_loop().time)
    while True:
        try:
            return await asyncpg.connect(dsn)
        except _DOWN as exc:
            delay = backoff.next_delay()
            if delay is None:
                reason = redact_text(" ".join(str(exc).split()) or type(exc).__name__, dsn)
                raise DatabaseUnreachable(
                    f"{where}cannot connect to {redact_url(dsn)} for {patience:g}s: {reason}"
                ) from None
            await asyncio.sleep(delay)


class ConnectionPool:
    """Up to ``size`` connections, opened on demand, handed out LIFO (warm ones first)."""

    def __init__(
        self, dsn: str, size: int, where: str = "", patience: float = CONNECT_PATIENCE
    ) -> None:
        if size < 1:
            raise ValueError(f"pool size must be at least 1, got {size}")
        self._dsn, self._where, self._patience = dsn, where, patience
        self.size = size
        self._idle: list[asyncpg.Connection] = []
        self._opened = 0
        self._waiters: deque[asyncio.Future[asyncpg.Connection | None]] = deque()
        self._statements: dict[tuple[int, str], asyncpg.prepared_stmt.PreparedStatement] = {}
        self._closed = False

    def try_acquire(self) -> asyncpg.Connection | None:
        """An idle connection, or None (then await :meth:`acquire`). Never suspends."""
        return self._idle.pop() if self._idle and not self._closed else None

    async def acquire(self) -> asyncpg.Connection:
        if self._closed:
            raise RuntimeError("connection pool is closed")
        if self._idle:
            return self._idle.pop()
        if self._opened < self.size:
            self._opened += 1
            try:
                return await _connect_patiently(self._dsn, self._where, self._patience)
            except BaseException:
                self._opened -= 1
                raise
        waiter: asyncio.Future[asyncpg.Connection | None] = (
            asyncio.get_running_loop().create_future()
        )
        self._waiters.append(waiter)
        conn = await waiter
        # None: a connection died meanwhile, so there is room to open a fresh one.
        return conn if conn is not None else await self.acquire()

    def release(self, conn: asyncpg.Connection) -> None:
        if conn.is_closed():  # broken (server restart, network): forget it
            self._opened -= 1
            self._forget(conn)
            self._wake(None)
            return
        if self._closed:
            conn.terminate()
            return
        self._wake(conn)

    def discard(self, conn: asyncpg.Connection) -> None:
        """Drop a connection whose last operation failed: its protocol state is unknown
        (a timed-out query may still be cancelling), so it is never handed out again."""
        conn.terminate()
        self.release(conn)

    def _wake(self, conn: asyncpg.Connection | None) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(conn)
                return
        if conn is not None:
            self._idle.append(conn)

    @asynccontextmanager
    async def connection(self) -> AsyncIterator[asyncpg.Connection]:
        conn = await self.acquire()
        try:
            yield conn
        finally:
            self.release(conn)

    def cached(
        self, conn: asyncpg.Connection, sql: str
    ) -> asyncpg.prepared_stmt.PreparedStatement | None:
        """``sql`` as already prepared on ``conn``, or None (no await on the hot path)."""
        return self._statements.get((id(conn), sql))

    async def prepared(
        self, conn: asyncpg.Connection, sql: str, timeout: float | None = None
    ) -> asyncpg.prepared_stmt.PreparedStatement:
        """``sql`` prepared once per connection (parsed and planned once, bound per call).

        Preparing reads the catalog and can wait on table locks, hence the timeout.
        """
        key = (id(conn), sql)
        statement = self._statements.get(key)
        if statement is None:
            statement = await conn.prepare(sql, timeout=timeout)
            self._statements[key] = statement
        return statement

    def _forget(self, conn: asyncpg.Connection) -> None:
        for key in [k for k in self._statements if k[0] == id(conn)]:
            del self._statements[key]

    async def close(self) -> None:
        self._closed = True
        idle, self._idle = self._idle, []
        self._statements.clear()
        for waiter in self._waiters:
            if not waiter.done():
                waiter.cancel()
        await asyncio.gather(*(conn.close() for conn in idle), return_exceptions=True)


_pools: dict[tuple[int, int, str], tuple[ConnectionPool, int]] = {}


def acquire_pool(
    dsn: str, size: int, where: str = "", patience: float = CONNECT_PATIENCE
) -> ConnectionPool:
    """The shared pool of ``dsn`` on the running loop (sized, its errors named with
    ``where`` and its patience set, by its first user)."""
    key = (os.getpid(), id(asyncio.get_running_loop()), dsn)
    entry = _pools.get(key)
    if entry is None:
        pool = ConnectionPool(dsn, size, where, patience)
        _pools[key] = (pool, 1)
        return pool
    _pools[key] = (entry[0], entry[1] + 1)
    return entry[0]


async def release_pool(dsn: str) -> None:
    """Give back one :func:`acquire_pool`; the last user closes the pool."""
    key = (os.getpid(), id(asyncio.get_running_loop()), dsn)
    pool, users = _pools[key]
    if users > 1:
        _pools[key] = (pool, users - 1)
        return
    del _pools[key]
    await pool.close()
