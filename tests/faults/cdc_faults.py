"""Helpers of the CDC fault cases: a change writer that survives Postgres crashes, a
watcher of the replication slot that checks it is never advanced past a committed offset,
and the fault-free runs that finish a snapshot before the stream's kills.

Neither imports the code under test's CDC modules: the watcher reads ``pg_replication_slots``
and ``sluice.splits`` with its own SQL, the writer is ``tests/cdc_oracle.py``'s
``ChangeGenerator`` with a reconnecting loop (the oracle stays the table itself: what the
writer committed is whatever the table holds at the end).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any

import psycopg
import sqlalchemy as sa
from cdc_oracle import ChangeGenerator, libpq_url
from fault_harness import Driver, splits_by_status
from kill_cases import LEASE_SECONDS, MAX_DRAIN_RUNS

__all__ = [
    "CrashProofWriter",
    "SlotSample",
    "SlotWatch",
    "chunk_states",
    "finish_snapshot",
    "slot_offsets",
]

#: A broken connection (the server crashed, is starting up, or refuses connections).
_DOWN = (psycopg.OperationalError, psycopg.InterfaceError)


class CrashProofWriter(ChangeGenerator):
    """``ChangeGenerator`` that reconnects when Postgres goes away and carries on.

    A statement cut off by a crash is not retried as such: whether it committed is the
    table's business (the oracle reads the table at the end), and every later insert or key
    change takes a fresh key, so no retry can collide with a change that did commit.
    ``reconnects`` counts the broken connections. Threading: its own thread; ``ops`` and
    ``reconnects`` are read by the test after ``stop()``.
    """

    def __init__(self, url: str, table: str, **kwargs: Any) -> None:
        super().__init__(url, table, **kwargs)
        self.reconnects = 0

    def run(self) -> None:
        done = 0
        while not self._stop_event.is_set() and (self._max is None or done < self._max):
            try:
                with psycopg.connect(self._url, autocommit=True, connect_timeout=5) as conn:
                    while not self._stop_event.is_set() and (self._max is None or done < self._max):
                        self._one(conn)
                        done += 1
                        if self._pause:
                            time.sleep(self._pause)
            except _DOWN:
                self.reconnects += 1
                self._stop_event.wait(0.3)
            except BaseException as exc:  # raised by stop()
                self.error = exc
                return


@dataclass(frozen=True)
class SlotSample:
    at: float
    confirmed_flush: int
    #: The greatest offset a completed checkpoint committed for a stream split (or the
    #: slot's start L0 while none did), read after ``confirmed_flush``.
    committed: int
    retained_bytes: int


class SlotWatch(threading.Thread):
    """Samples the slot every ``every`` seconds until ``stop()``: its ``confirmed_flush_lsn``
    must never pass the greatest offset a completed checkpoint committed (the stream splits'
    ``committed_offset``; their ``start_offset`` too — the first one starts at L0, later ones
    where the last one's committed output ended). ``l0``: the slot's start, read after the
    first discovery. Offsets only grow, so reading the slot first and the offsets second
    never reports a violation that was not one. Samples while Postgres is down are skipped.
    ``slot_url``: the server the slot is on, when it is not the platform's (``url``).
    Threading: its own thread; the lists are read by the test after ``stop()``."""

    def __init__(
        self,
        url: str,
        slot: str,
        source: str,
        l0: int,
        every: float = 0.25,
        slot_url: str | None = None,
    ) -> None:
        super().__init__(name=f"slot-watch-{slot}", daemon=True)
        self.url, self.slot, self.source, self.l0, self.every = url, slot, source, l0, every
        self.slot_url = slot_url or url
        self.samples: list[SlotSample] = []
        self.violations: list[SlotSample] = []
        self.down = 0
        self.error: BaseException | None = None
        self._halt = threading.Event()

    def stop(self) -> None:
        self._halt.set()
        self.join(30)

    def run(self) -> None:
        t0 = time.monotonic()
        while not self._halt.is_set():
            try:
                with (
                    psycopg.connect(libpq_url(self.url), autocommit=True, connect_timeout=3) as c,
                    psycopg.connect(
                        libpq_url(self.slot_url), autocommit=True, connect_timeout=3
                    ) as on_slot,
                ):
                    while not self._halt.wait(self.every):
                        flushed, committed, retained = slot_offsets(
                            on_slot, self.slot, self.source, c
                        )
                        sample = SlotSample(
                            time.monotonic() - t0, flushed, max(committed, self.l0), retained
                        )
                        self.samples.append(sample)
                        if sample.confirmed_flush > sample.committed:
                            self.violations.append(sample)
            except _DOWN:
                self.down += 1
                self._halt.wait(0.3)
            except BaseException as exc:  # shown by the test (a slot gone, a bad query)
                self.error = exc
                return


def slot_offsets(
    conn: psycopg.Connection[Any],
    slot: str,
    source: str,
    platform: psycopg.Connection[Any] | None = None,
) -> tuple[int, int, int]:
    """(the slot's confirmed_flush_lsn, the stream splits' greatest committed or start
    offset — 0: none yet, WAL bytes the slot retains), each as an integer; the slot read
    on ``conn`` first, then the offsets on ``platform`` (default ``conn``)."""
    row = conn.execute(
        "SELECT confirmed_flush_lsn - '0/0', pg_current_wal_lsn() - restart_lsn"
        " FROM pg_replication_slots WHERE slot_name = %s",
        (slot,),
    ).fetchone()
    assert row is not None, f"the replication slot {slot} is gone"
    offset = (
        (platform or conn)
        .execute(
            "SELECT COALESCE(max(GREATEST(start_offset, COALESCE(committed_offset, 0))), 0)"
            " FROM sluice.splits WHERE source = %s AND kind = 'pgcdc'",
            (source,),
        )
        .fetchone()
    )
    assert offset is not None
    return int(row[0]), int(offset[0]), int(row[1])


def chunk_states(engine: sa.Engine, pipeline: str) -> dict[str, int]:
    """The pipeline's snapshot chunks by status (``engine``: the platform database)."""
    return splits_by_status(engine, pipeline, "pgcdc-chunk")


def finish_snapshot(driver: Driver, engine: sa.Engine, pipeline: str) -> None:
    """Fault-free runs until every snapshot chunk is committed (the stream comes next)."""
    for _ in range(MAX_DRAIN_RUNS):
        if set(chunk_states(engine, pipeline)) == {"COMPLETED"}:
            return
        record = driver.finish_run(driver.start_run(), [])
        if record.returncode not in (0, 3):
            time.sleep(LEASE_SECONDS + 1)
    raise AssertionError(f"the snapshot was not committed: {chunk_states(engine, pipeline)}")
