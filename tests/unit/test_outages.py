"""The lookup retry predicate: connection-level failures are transient, SQL errors are not."""

from __future__ import annotations

import asyncpg

from spark_jobs.jobs._outages import is_transient


def test_connection_failures_are_transient() -> None:
    assert is_transient(ConnectionResetError("reset by peer"))
    assert is_transient(asyncpg.exceptions.ConnectionDoesNotExistError("gone"))
    assert is_transient(asyncpg.exceptions.CannotConnectNowError("starting up"))
    assert is_transient(asyncpg.exceptions.TooManyConnectionsError("too many"))


def test_sql_and_programming_errors_are_not() -> None:
    assert not is_transient(asyncpg.exceptions.UndefinedTableError("no table"))
    assert not is_transient(ValueError("bad key"))
