"""The table lock of the lakehouse committers (``table_lock``) on a real Postgres: a holder
that dies frees it, so a committer waiting for it goes on (no hang behind a dead process)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import sqlalchemy as sa

from enumerator_service._database import connect_engine
from spark_jobs.sink import table_lock

REPO = Path(__file__).resolve().parents[2]
TABLE = "/warehouse/lake/orders_enriched"

_HOLDER = textwrap.dedent(
    """
    import sys, time
    from enumerator_service._database import connect_engine
    from spark_jobs.sink import table_lock

    with table_lock(connect_engine(sys.argv[1], pool_size=1), sys.argv[2]):
        print("held", flush=True)
        time.sleep(120)
    """
)


def _waiting(engine: sa.Engine) -> int:
    """Sessions waiting for an advisory lock right now."""
    with engine.connect() as conn:
        return int(
            conn.execute(
                sa.text("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted")
            ).scalar_one()
        )


def test_a_holder_killed_under_the_lock_frees_it_for_the_waiting_committer(db_url: str) -> None:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
    }
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLDER, db_url, TABLE],
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )
    engine = connect_engine(db_url, pool_size=2)
    acquired = threading.Event()

    def commit() -> None:
        with table_lock(engine, TABLE):
            acquired.set()

    waiter = threading.Thread(target=commit, daemon=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        waiter.start()
        deadline = time.monotonic() + 10
        while _waiting(engine) == 0:  # the committer is queued behind the holder
            assert time.monotonic() < deadline, "the waiter never queued for the lock"
            time.sleep(0.05)
        assert not acquired.wait(0.5), "the lock was not exclusive"
        killed = time.monotonic()
        os.kill(holder.pid, signal.SIGKILL)
        assert acquired.wait(10), "the lock of a killed holder was never freed"
        print(f"RESULT lock freed {time.monotonic() - killed:.2f}s after the holder's SIGKILL")
        waiter.join(10)
        assert not waiter.is_alive() and _waiting(engine) == 0
    finally:
        if holder.poll() is None:
            holder.kill()
        holder.wait(10)
        waiter.join(10)
        engine.dispose()
