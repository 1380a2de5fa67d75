"""A run taking a CDC stream over from a reader that is going away (real Postgres): the old
walsender still holds the slot for a moment, so the new reader's open waits for it (a
cancelled continuous run followed at once by a bounded one failed its task attempts with
"replication slot ... is active"), and fails only after its wait."""

from __future__ import annotations

import logging
import secrets
import threading
import time

import psycopg2.errors
import pytest
import sqlalchemy as sa

from enumerator_service import connect_engine
from spark_jobs.connectors.postgres_cdc import drop_slot
from spark_jobs.connectors.postgres_cdc._publication import ensure_publication
from spark_jobs.connectors.postgres_cdc._replication import open_replication
from spark_jobs.connectors.postgres_cdc._slot import ensure_slot


def test_an_open_waits_for_the_readers_slot_to_be_released(
    db_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    engine = connect_engine(db_url)
    dsn = db_url.replace("postgresql+psycopg://", "postgresql://", 1)
    slot = f"sluice_take_{secrets.token_hex(3)}"
    with engine.begin() as conn:
        conn.execute(sa.text(f"CREATE TABLE public.{slot} (id bigint PRIMARY KEY)"))
        ensure_publication(conn, slot, [("public", slot)])
    start, _ = ensure_slot(engine, slot)
    try:
        old, _ = open_replication(dsn, slot, start, slot)  # the reader going away
        with pytest.raises(psycopg2.errors.ObjectInUse):  # held for longer than the wait
            open_replication(dsn, slot, start, slot, wait=0.5)
        threading.Timer(1.0, old.close).start()
        began = time.monotonic()
        caplog.clear()
        with caplog.at_level(logging.WARNING):
            new, _ = open_replication(dsn, slot, start, slot, wait=20.0)
        assert 0.8 < time.monotonic() - began < 20.0
        waits = [r.getMessage() for r in caplog.records if "still held" in r.getMessage()]
        assert waits == [
            f"replication slot {slot} is still held by a previous reader; waiting up to 20s"
            " for its server process to release it"
        ]
        new.close()
    finally:
        drop_slot(engine, slot, slot)
        with engine.begin() as conn:
            conn.execute(sa.text(f"DROP TABLE public.{slot}"))
        engine.dispose()
