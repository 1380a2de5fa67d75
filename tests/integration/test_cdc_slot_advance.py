"""An idle slot advanced to a committed offset keeps little WAL, even after a long run.

Postgres moves a logical slot's ``restart_lsn`` (what the server keeps) only to decoding
restart points it may take: one advance over a run's WAL moved it to the first restart point
past the previous confirmed position, so the slot kept nearly the whole run (a fault case:
133 of 133 MiB). ``advance_slot`` must leave it near the offset it confirms.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator

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


def _write_wal(engine: Engine, table: str, rounds: int) -> None:
    """About 1 MiB of WAL per round; a restart point (running-transactions record) after each,
    like the ones the server logs every 15 s of a busy run."""
    for number in range(rounds):
        with engine.begin() as conn:
            conn.execute(
                sa.text(
                    f"INSERT INTO {table} SELECT g, repeat('x', 400)"
                    " FROM generate_series(CAST(:a AS int), CAST(:b AS int)) g"
                ),
                {"a": number * 2000, "b": number * 2000 + 1999},
            )
        with engine.connect() as conn:
            conn.execute(sa.text("SELECT pg_log_standby_snapshot()"))
            conn.commit()


def test_an_advanced_idle_slot_keeps_only_the_wal_after_its_last_restart_point(
    slot_and_table: tuple[Engine, str, str],
) -> None:
    engine, table, slot = slot_and_table
    ensure_slot(engine, slot)
    _write_wal(engine, table, rounds=8)
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
    assert after.restart_lsn is not None and target - after.restart_lsn < 2 << 20
    # Advancing again to where it is: nothing to do.
    assert not advance_slot(engine, slot, target)


def test_a_slot_its_reader_confirmed_still_gives_its_wal_back(
    slot_and_table: tuple[Engine, str, str],
) -> None:
    """A run's reader confirms the committed offset on its open stream (status updates):
    confirmed_flush is there when the run ends, but restart_lsn trails by most of the run's
    WAL (as after one advance). ``advance_slot`` to that offset moves restart_lsn up."""
    engine, table, slot = slot_and_table
    ensure_slot(engine, slot)
    _write_wal(engine, table, rounds=14)
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
    assert after.restart_lsn is not None and target - after.restart_lsn < 2 << 20
    assert not advance_slot(engine, slot, target)  # nothing left to give back
