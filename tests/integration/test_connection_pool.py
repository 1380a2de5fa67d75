"""The lookup connection pool on a real Postgres: bounded, fair to waiters, self-healing."""

from __future__ import annotations

import asyncio
import socket

import pytest
from sqlalchemy.engine import make_url

from enumerator_service import asyncpg_dsn
from spark_jobs.lookup import ConnectionPool, DatabaseUnreachable


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


async def _relay(port: int, upstream: tuple[str, int]) -> asyncio.Server:
    """127.0.0.1:``port`` forwarded to the server (a server "coming back"): ``upstream`` is
    its Unix socket directory and port, or its host and port."""

    async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        finally:
            writer.close()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        where, number = upstream
        if where.startswith("/"):
            opened = asyncio.open_unix_connection(f"{where}/.s.PGSQL.{number}")
        else:
            opened = asyncio.open_connection(where, number)
        up_reader, up_writer = await opened
        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))

    return await asyncio.start_server(serve, "127.0.0.1", port)


def _relayed_dsn(db_url: str) -> tuple[tuple[str, int], int, str]:
    """(the server's address for ``_relay``, a free TCP port, the DSN through that port)."""
    url = make_url(db_url)
    host = url.query.get("host")
    upstream = (str(host if isinstance(host, str) else url.host), url.port or 5432)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    # (a trusted Unix socket ignores the password; a server on TCP needs the real one)
    password = url.password or "secret-pw"
    dsn = f"postgresql://{url.username}:{password}@127.0.0.1:{port}/{url.database}"
    return upstream, port, dsn


def test_a_pool_waits_for_a_database_that_comes_back(db_url: str) -> None:
    upstream, port, dsn = _relayed_dsn(db_url)

    async def scenario() -> None:
        pool = ConnectionPool(dsn, size=1, where="Lookup(url_env) $CRM: ", patience=20)
        acquiring = asyncio.ensure_future(pool.acquire())
        await asyncio.sleep(1.0)  # refused meanwhile: nothing listens on the port yet
        assert not acquiring.done()
        relay = await _relay(port, upstream)
        conn = await asyncio.wait_for(acquiring, 15)
        assert await conn.fetchval("SELECT 1") == 1
        pool.release(conn)
        await pool.close()
        relay.close()

    asyncio.run(scenario())


def test_past_its_patience_a_pool_names_the_database_without_its_password(db_url: str) -> None:
    _, _, dsn = _relayed_dsn(db_url)

    async def scenario() -> None:
        pool = ConnectionPool(dsn, size=1, where="Lookup(url_env) $CRM: ", patience=0.5)
        with pytest.raises(DatabaseUnreachable) as raised:
            await pool.acquire()
        message = str(raised.value)
        assert message.startswith("Lookup(url_env) $CRM: cannot connect to postgresql://"), message
        assert "for 0.5s" in message and (make_url(dsn).password or "") not in message
        await pool.close()

    asyncio.run(scenario())
