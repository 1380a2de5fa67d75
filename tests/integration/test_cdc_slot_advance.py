"""An idle slot advanced to a committed offset keeps little WAL, even after a long run.

Postgres moves a logical slot's ``restart_lsn`` (what the server keeps) only to decoding
restart points it may take: one advance over a run's WAL moved it to the first restart point
past the previous confirmed position, so the slot kept nearly the whole run (a fault case:
133 of 133 MiB). ``advance_slot`` must leave it near the offset it confirms.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from enumerator_service import connect_engine
from spark_jobs.connectors.postgres_cdc import drop_slot, slot_info
from spark_jobs.connectors.postgres_cdc._slot import (
    advance_slot,
    current_lsn,
    ensure_slot,
    lsn_text,
)


@pytest.fixture
def slot_and_table(db_url: str) -> Iterator[tuple[Engine, str, str]]:
    """(engine, a new table, a new slot's name); the slot and the table dropped after."""
    engine = connect_engine(db_url)
    table = f"wal_{secrets.token_hex(3)}"
    slot = f"sluice_test_{secrets.token_hex(3)}"
    with engine.begin() as conn:
        conn.execute(sa.text(f"CREATE TABLE {table} (id int PRIMARY KEY, v text)"))
    try:
        yield engine, table, slot
    finally:
        drop_slot(engine, slot, None)
        with engine.begin() as conn:
            conn.execute(sa.text(f"DROP TABLE {table}"))
        engine.dispose()


#: What an advance may keep below ``WalWritten.lowest_restart``: about two rounds. The bugs
#: these tests are for kept 7.4 MiB (one advance pass) and all of a run's WAL (a confirmed
#: slot); a 2 MiB bound failed once in 961 tests under the other test process's load (2.2).
_SLACK = 4 << 20


@dataclass
class WalWritten:
    """The lowest ``restart_lsn`` an advance over the rounds' WAL may leave.

    Logical decoding restarts at the last restart point before the first record of any
    transaction still running at the restart point it takes, in any database of the server
    (the other test process's long COPY counts). On a quiet server that is the last round's
    restart point; a transaction of another session that spanned rounds holds it at the
    restart point before the round in which it was first seen running."""

    lowest_restart: int


def _running_xids(conn: sa.Connection) -> set[int]:
    rows = conn.execute(sa.text("SELECT pg_snapshot_xip(pg_current_snapshot())::text::bigint"))
    return {int(row[0]) for row in rows}


def _write_wal(engine: Engine, table: str, rounds: int) -> WalWritten:
    """About 1 MiB of WAL per round; a restart point (running-transactions record) after each,
    like the ones the server logs every 15 s of a busy run."""
    running_at_start: list[set[int]] = []
    restart_points: list[int] = []
    running: set[int] = set()
    for number in range(rounds):
        with engine.connect() as conn:
            running_at_start.append(_running_xids(conn))
        with engine.begin() as conn:
            conn.execute(
                sa.text(
                    f"INSERT INTO {table} SELECT g, repeat('x', 400)"
                    " FROM generate_series(CAST(:a AS int), CAST(:b AS int)) g"
                ),
                {"a": number * 2000, "b": number * 2000 + 1999},
            )
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            running = _running_xids(conn)
            lsn = conn.execute(sa.text("SELECT pg_log_standby_snapshot() - '0/0'")).scalar_one()
            restart_points.append(int(lsn))
    lowest = restart_points[-1]
    for xid in running:
        # First seen running in the round after the last one it was not running at the start of.
        fresh = [k for k, xids in enumerate(running_at_start) if xid not in xids]
        lowest = min(lowest, restart_points[fresh[-1] - 1] if fresh and fresh[-1] else 0)
    return WalWritten(lowest)


def test_an_advanced_idle_slot_keeps_only_the_wal_after_its_last_restart_point(
    slot_and_table: tuple[Engine, str, str],
) -> None:
    engine, table, slot = slot_and_table
    ensure_slot(engine, slot)
    wal = _write_wal(engine, table, rounds=8)
    with engine.connect() as conn:
        target = current_lsn(conn)
        before = slot_info(conn, slot)
    assert before is not None and before.retained_bytes > 6 << 20  # the run's WAL
    assert advance_slot(engine, slot, target)
    with engine.connect() as conn:
        after = slot_info(conn, slot)
    assert after is not None and after.confirmed_flush == target
    # Kept: about the last round (Postgres restarts decoding from a restart point a
    # little before the last one), not the 8 rounds (one advance alone kept ~7).
    assert after.restart_lsn is not None
    assert wal.lowest_restart - after.restart_lsn < _SLACK, (wal, after)
    # Advancing again to where it is: nothing to do (unless a transaction elsewhere held it).
    if target - after.restart_lsn < 8 << 20:
        assert not advance_slot(engine, slot, target)


def test_a_slot_its_reader_confirmed_still_gives_its_wal_back(
    slot_and_table: tuple[Engine, str, str],
) -> None:
    """A run's reader confirms the committed offset on its open stream (status updates):
    confirmed_flush is there when the run ends, but restart_lsn trails by most of the run's
    WAL (as after one advance). ``advance_slot`` to that offset moves restart_lsn up."""
    engine, table, slot = slot_and_table
    ensure_slot(engine, slot)
    wal = _write_wal(engine, table, rounds=14)
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        target = current_lsn(conn)
        # What the reader's confirmations leave behind (one move of the slot).
        conn.execute(
            sa.text("SELECT pg_replication_slot_advance(:s, CAST(:lsn AS pg_lsn))"),
            {"s": slot, "lsn": lsn_text(target)},
        )
        before = slot_info(conn, slot)
    assert before is not None and before.confirmed_flush == target
    assert before.restart_lsn is not None and target - before.restart_lsn > 8 << 20
    assert advance_slot(engine, slot, target)
    with engine.connect() as conn:
        after = slot_info(conn, slot)
    assert after is not None and after.confirmed_flush == target
    assert after.restart_lsn is not None
    assert wal.lowest_restart - after.restart_lsn < _SLACK, (wal, after)
    if target - after.restart_lsn < 8 << 20:  # else a transaction elsewhere held it
        assert not advance_slot(engine, slot, target)  # nothing left to give back
