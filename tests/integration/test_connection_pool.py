"""The lookup connection pool on a real Postgres: bounded, fair to waiters, self-healing."""

from __future__ import annotations

import asyncio

from enumerator_service import asyncpg_dsn
from spark_jobs.lookup import ConnectionPool


def test_pool_is_bounded_and_hands_released_connections_to_waiters(db_url: str) -> None:
    async def scenario() -> None:
        pool = ConnectionPool(asyncpg_dsn(db_url), size=2)
        first, second = await pool.acquire(), await pool.acquire()
        third = asyncio.ensure_future(pool.acquire())
        await asyncio.sleep(0)
        assert not third.done()  # no third connection is opened
        pool.release(first)
        assert await asyncio.wait_for(third, 5) is first
        pool.release(second)
        pool.release(first)
        await pool.close()

    asyncio.run(scenario())


def test_dead_connections_are_replaced(db_url: str) -> None:
    async def scenario() -> None:
        pool = ConnectionPool(asyncpg_dsn(db_url), size=1)
        conn = await pool.acquire()
        waiting = asyncio.ensure_future(pool.acquire())
        await asyncio.sleep(0)
        pool.discard(conn)  # e.g. its query timed out: never handed out again
        fresh = await asyncio.wait_for(waiting, 5)
        assert fresh is not conn
        assert not fresh.is_closed()
        assert await fresh.fetchval("SELECT 1") == 1
        pool.release(fresh)
        await pool.close()

    asyncio.run(scenario())


def test_statements_are_prepared_once_per_connection(db_url: str) -> None:
    async def scenario() -> None:
        pool = ConnectionPool(asyncpg_dsn(db_url), size=1)
        async with pool.connection() as conn:
            one = await pool.prepared(conn, "SELECT $1::int + 1")
            again = await pool.prepared(conn, "SELECT $1::int + 1")
            assert one is again
            assert await one.fetchval(41) == 42
        await pool.close()

    asyncio.run(scenario())
