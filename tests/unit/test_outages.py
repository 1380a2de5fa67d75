"""Outages: the lookup retry predicate (connection-level failures are transient, SQL errors are
not) and the driver's wrap-up that waits out a database restart."""

from __future__ import annotations

import asyncpg
import psycopg
import pytest
import sqlalchemy as sa
from psycopg import errors

from enumerator_service import ServerUnreachable
from spark_jobs.jobs._outages import connection_lost, coordinator_failed, is_transient


def test_connection_failures_are_transient() -> None:
    assert is_transient(ConnectionResetError("reset by peer"))
    assert is_transient(asyncpg.exceptions.ConnectionDoesNotExistError("gone"))
    assert is_transient(asyncpg.exceptions.CannotConnectNowError("starting up"))
    assert is_transient(asyncpg.exceptions.TooManyConnectionsError("too many"))


def test_sql_and_programming_errors_are_not() -> None:
    assert not is_transient(asyncpg.exceptions.UndefinedTableError("no table"))
    assert not is_transient(ValueError("bad key"))


def test_the_wrap_up_waits_out_a_database_restart(monkeypatch: pytest.MonkeyPatch) -> None:
    from spark_jobs.jobs import _outages

    slept: list[float] = []
    monkeypatch.setattr(_outages.time, "sleep", slept.append)
    down = sa.exc.OperationalError("SELECT 1", {}, Exception("connection is bad"))
    outcomes: list[Exception | str] = [down, down, "done"]

    def step() -> str:
        outcome = outcomes.pop(0)
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    assert _outages.while_down(step) == "done"
    assert slept == [0.2, 0.4]  # backing off
    with pytest.raises(sa.exc.OperationalError):
        _outages.while_down(lambda: (_ for _ in ()).throw(down), patience=0.0)
    with pytest.raises(ValueError, match="invalid literal"):  # not an outage: at once
        _outages.while_down(lambda: int("x"))


def _wrapped(cause: Exception) -> sa.exc.OperationalError:
    return sa.exc.OperationalError("UPDATE sluice.splits SET …", {}, cause)


def test_a_lost_platform_connection_is_told_apart_from_a_statements_failure() -> None:
    gone = psycopg.OperationalError("connection is bad: no such file or directory")
    assert connection_lost(_wrapped(gone)) and connection_lost(gone)
    assert connection_lost(_wrapped(errors.AdminShutdown("terminating connection")))
    assert connection_lost(_wrapped(errors.ConnectionFailure("connection failure")))
    assert not connection_lost(_wrapped(errors.DiskFull("could not extend file")))
    assert not connection_lost(_wrapped(errors.SerializationFailure("could not serialize")))
    assert not connection_lost(ValueError("bad"))


def test_the_coordinators_failure_names_the_platform_database_when_it_went_away() -> None:
    lost = coordinator_failed(_wrapped(psycopg.OperationalError("connection is bad: gone\nmore")))
    assert isinstance(lost, ServerUnreachable) and lost.setting == "SLUICE_DATABASE_URL"
    assert "stopped answering during the run (connection is bad: gone)" in str(lost)
    assert "\n" not in str(lost) and "UPDATE" not in str(lost)
    full = coordinator_failed(_wrapped(errors.DiskFull("could not extend file")))
    assert type(full) is RuntimeError
    assert str(full) == "checkpoint coordinator failed: could not extend file"
