"""Outages: the lookup retry predicate (connection-level failures are transient, SQL errors are
not) and the driver's wrap-up that waits out a database restart."""

from __future__ import annotations

import asyncpg
import pytest
import sqlalchemy as sa

from spark_jobs.jobs._outages import is_transient


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
