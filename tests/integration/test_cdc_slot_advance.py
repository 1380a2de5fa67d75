"""An idle slot advanced to a committed offset keeps little WAL, even after a long run.

Postgres moves a logical slot's ``restart_lsn`` (what the server keeps) only to decoding
restart points it may take: one advance over a run's WAL moved it to the first restart point
past the previous confirmed position, so the slot kept nearly the whole run (a fault case:
133 of 133 MiB). ``advance_slot`` must leave it near the offset it confirms.
"""

from __future__ import annotations

import secrets

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from enumerator_service import connect_engine
from spark_jobs.connectors.postgres_cdc import drop_slot, slot_info
from spark_jobs.connectors.postgres_cdc._slot import advance_slot, current_lsn, ensure_slot


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
    db_url: str,
) -> None:
    engine = connect_engine(db_url)
    table = f"wal_{secrets.token_hex(3)}"
    slot = f"sluice_test_{secrets.token_hex(3)}"
    with engine.begin() as conn:
        conn.execute(sa.text(f"CREATE TABLE {table} (id int PRIMARY KEY, v text)"))
    try:
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
    finally:
        drop_slot(engine, slot, None)
        with engine.begin() as conn:
            conn.execute(sa.text(f"DROP TABLE {table}"))
        engine.dispose()
