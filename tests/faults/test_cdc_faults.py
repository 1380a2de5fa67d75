"""Exactly-once of the Postgres CDC source under faults: the sink table equals the source
table (missing 0, extra 0, duplicates 0, differing 0) after SIGKILLed Spark workers and
drivers and crashed Postgres servers, while a writer keeps changing the table.

- ``cdc_kills``: a 20k-row table (10 snapshot chunks), then the stream, in repeated bounded
  `sluice run`s (a `sluice discover` before each, as a schedule would do) under a concurrent
  writer — inserts, hot-row updates, deletes, key changes, multi-change transactions
  (``tests/cdc_oracle.py``) — that reconnects after each Postgres crash. Workers, drivers and
  Postgres are killed at seeded moments, in the snapshot and in the stream. A watcher samples
  ``pg_replication_slots`` all along: the slot's ``confirmed_flush_lsn`` never passes the
  greatest offset a completed checkpoint committed. After the writer stops and fault-free
  runs drain, the sink equals the table, and the slot retains little WAL (a discovery moves
  the idle slot to the last committed offset).
- ``cdc_snapshot``: a 200k-row table (8 chunks of 25k rows, several seconds of reading);
  Postgres crashes while the chunks are being read (some read, some not) and restarts; the run
  or its successors finish the snapshot and the stream; the sink equals the table.

The oracle is the source table itself, read by the test with its own SQL after the writer
stopped (whatever the writer committed is in it, whatever a crash cut off is not). Runs go
through the ``sluice`` CLI in subprocesses against a Postgres of the test's own, started with
``wal_level = logical``. The seed is printed; ``SLUICE_FAULTS_SEED=<n>`` replays a schedule.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
import sqlalchemy as sa
from cdc_faults import CrashProofWriter, SlotWatch, chunk_states, finish_snapshot, slot_offsets
from cdc_oracle import compare, create_table, libpq_url, rows_of
from fault_harness import Chaos, Driver, OwnPostgres, Run, log, sluice, sluice_env, split_counts
from kill_cases import (
    LEASE_SECONDS,
    SEED,
    SPARK_START,
    chaos_session,
    drain_stream,
    own_postgres,
    python_path,
    run_settings,
    stream_driver,
)

# `extended`: minutes each (`make faults` runs them, `make test` leaves them out).
pytestmark = [
    pytest.mark.faults,
    pytest.mark.extended,
    pytest.mark.spark,
    pytest.mark.timeout(1200),
]

MODULE = "tests.faults.cdc_pipelines"
#: Kill points of each phase (the order shuffled by the seed): every kind once while the
#: snapshot chunks are read, once more while the stream is. A CDC run under the writer takes
#: 30-100 s on a busy 2-core machine: without the phases every kill landed in the snapshot.
PHASE_PLAN = ["worker", "driver", "postgres"]
KILLS_ROWS = 20_000
SNAPSHOT_ROWS = 200_000
#: Discoveries (each a new bounded stream split) at most while kills are left.
MAX_TOP_UPS = 30
#: WAL the idle slot may retain after the final discovery moved it (twice: see
#: ``advance_slot``) to the last committed offset: what follows the last decoding restart
#: point before it. Before the second advance a case kept 8-133 MiB of the 30-133 MiB it
#: wrote; the figure is printed.
RETAINED_MAX = 32 << 20


@pytest.fixture(scope="module")
def postgres(request: pytest.FixtureRequest) -> Iterator[tuple[OwnPostgres, Path]]:
    with own_postgres(request, logical=True) as server_and_root:
        yield server_and_root


def _env(work: Path, db_url: str) -> dict[str, str]:
    settings = {**run_settings(work, db_url, MODULE), "PYTHONPATH": python_path()}
    return sluice_env(settings, work)


class Case:
    """One CDC case's database, table, environment and CLI calls."""

    def __init__(self, postgres: tuple[OwnPostgres, Path], pipeline: str, table: str) -> None:
        self.server, root = postgres
        self.pipeline, self.table = pipeline, table
        self.work = root / pipeline
        self.work.mkdir()
        self.db_url = self.server.create_database(f"faults_{pipeline}")
        # No pool: a pooled connection would not survive the Postgres crashes.
        self.engine = sa.create_engine(
            sa.make_url(self.db_url).set(drivername="postgresql+psycopg"),
            poolclass=sa.pool.NullPool,
        )
        self.env = _env(self.work, self.db_url)
        self.discoveries = 0

    def discover(self) -> str:
        self.discoveries += 1
        return sluice(self.env, self.work, "discover", self.pipeline).strip()

    def slot(self) -> tuple[int, int, int]:
        with psycopg.connect(libpq_url(self.db_url), autocommit=True) as conn:
            return slot_offsets(conn, f"sluice_{self.pipeline}", self.pipeline)

    def writer(self, seed: int) -> CrashProofWriter:
        return CrashProofWriter(
            self.db_url, self.table, first_new_key=10_000_000, pause=0.005, seed=seed
        )

    def drain(self, driver: Driver) -> None:
        """Discover and run (no faults) until every split is COMPLETED and the sink equals
        the table (the writer has stopped: the last bounded stream run reads past its last
        change)."""
        drain_stream(
            driver,
            lambda: log(f"discover: {self.discover()}"),
            lambda: self.diff().equal,
            lambda: f"; {self.diff()}",
        )

    def diff(self) -> object:
        return compare(rows_of(self.engine, self.table), rows_of(self.engine, f"{self.table}_out"))

    def verdict(self, label: str) -> None:
        """The sink equals the table: printed, then asserted."""
        diff = compare(rows_of(self.engine, self.table), rows_of(self.engine, f"{self.table}_out"))
        rows = len(rows_of(self.engine, self.table))
        print(
            f"RESULT {label}: table_rows={rows} missing={len(diff.missing)} "
            f"extra={len(diff.extra)} duplicates={len(diff.duplicates)} "
            f"differing={len(diff.differing)} splits={split_counts(self.db_url, self.pipeline)}",
            flush=True,
        )
        assert diff.equal, str(diff)
        assert not diff.missing and not diff.extra and not diff.duplicates and not diff.differing


def test_cdc_sink_equals_table_under_kills(postgres: tuple[OwnPostgres, Path]) -> None:
    case = Case(postgres, "cdc_kills", "public.cdc_kills")
    sluice(case.env, case.work, "db", "upgrade")
    create_table(case.engine, case.table, rows=KILLS_ROWS)
    log(f"discover: {case.discover()}")
    l0, _, _ = case.slot()
    chaos = Chaos(SEED, list(PHASE_PLAN))
    log(f"seed {SEED}; slot start L0 {l0}")

    def top_up() -> bool:
        """A schedule's next tick: the next bounded stream split (the writer keeps writing)."""
        if case.discoveries > MAX_TOP_UPS:
            return False
        log(f"discover: {case.discover()}")
        return True

    driver = stream_driver(
        chaos, case.env, case.work, case.server, case.db_url, case.pipeline, top_up
    )
    writer = case.writer(SEED)
    watch = SlotWatch(case.db_url, "sluice_cdc_kills", case.pipeline, l0)
    writer.start()
    watch.start()
    with chaos_session(driver, "cdc_kills", [writer, watch]):
        # Phase 1: kills while the chunks are read (should the snapshot be committed with
        # kills left, top_up registers stream splits and the rest land in the stream).
        driver.spend_budget()
        in_snapshot = len(chaos.kills)
        finish_snapshot(driver, case.engine, case.pipeline)
        chaos.plan = list(PHASE_PLAN)
        chaos.rng.shuffle(chaos.plan)
        stream_from = len(chaos.runs) + 1
        log(f"the snapshot is committed; discover: {case.discover()}")
        driver.spend_budget()  # phase 2: kills while the stream is read
        writer.stop()
        log(f"writer stopped: {writer.ops}, {writer.reconnects} reconnects")
        case.drain(driver)
    log(f"cdc_kills: {in_snapshot} kills from the start of the snapshot on")
    snapshot, stream = chaos.kills[:in_snapshot], chaos.kills[in_snapshot:]
    assert sorted(k.kind for k in snapshot) == sorted(PHASE_PLAN)
    assert sorted(k.kind for k in stream) == sorted(PHASE_PLAN)
    assert all(k.run >= stream_from for k in stream)
    assert sum(writer.ops.values()) > 1_000, writer.ops
    assert writer.ops.get("delete") and writer.ops.get("rekey") and writer.ops.get("txn")
    assert writer.reconnects >= 1  # the writer met the Postgres crashes
    case.verdict("cdc_kills")
    _assert_slot(case, watch)


def _assert_slot(case: Case, watch: SlotWatch) -> None:
    """The slot never passed a committed offset; after a last discovery moved the idle slot,
    it sits at the last committed offset and retains little WAL."""
    assert watch.error is None, watch.error
    peak = max((s.retained_bytes for s in watch.samples), default=0)
    log(
        f"slot watch: {len(watch.samples)} samples, {len(watch.violations)} past a committed "
        f"offset, {watch.down} times down, peak retained {peak / 2**20:.1f} MiB"
    )
    assert len(watch.samples) > 20
    assert watch.violations == [], watch.violations[:5]
    log(f"discover: {case.discover()}")  # moves the idle slot to the last committed offset
    flushed, committed, retained = case.slot()
    with psycopg.connect(libpq_url(case.db_url), autocommit=True) as conn:
        row = conn.execute("SELECT pg_current_wal_lsn() - '0/0'").fetchone()
    assert row is not None
    written = int(row[0]) - watch.l0
    log(
        f"after the final run: confirmed_flush {flushed}, committed {committed}, retained "
        f"{retained / 2**20:.2f} MiB of the {written / 2**20:.2f} MiB written since L0"
    )
    assert flushed == committed  # the idle slot was moved to the last committed offset
    assert retained <= RETAINED_MAX


def _crash_during_snapshot(case: Case, driver: Driver, chunks: int, run: Run) -> list[str]:
    """Crash Postgres once some chunk of ``run`` is being read and before all are
    committed; returns the faults the run met."""
    rng = driver.chaos.rng
    deadline = time.monotonic() + SPARK_START
    while not chunk_states(case.engine, case.pipeline).get("READING"):
        assert run.alive() and time.monotonic() < deadline, run.output()[-3000:]
        time.sleep(0.05)
    # Into the reading of the chunks: once `done` of them are committed (a point drawn from
    # the seed, by progress rather than by time: a quiet machine reads 200,000 rows in ~2 s)
    # — or at the last chance: chunks complete a checkpoint's worth at a time, so the count
    # can jump past `done` to the end; once every chunk left is being read, crash now.
    done = rng.randint(0, chunks - 2)
    states = chunk_states(case.engine, case.pipeline)
    while states.get("READING"):
        completed, reading = states.get("COMPLETED", 0), states["READING"]
        if completed >= done or completed + reading >= chunks:
            break
        assert run.alive() and time.monotonic() < deadline, run.output()[-3000:]
        time.sleep(0.05)
        states = chunk_states(case.engine, case.pipeline)
    # Still in the snapshot: some chunk read now, not every one committed.
    assert states.get("READING") and states.get("COMPLETED", 0) < chunks, states
    downtime = rng.uniform(1.0, 3.0)
    old = case.server.postmaster_pid()
    case.server.restart(downtime)
    driver.record_kill(
        "postgres",
        run,
        f"Postgres crash during the snapshot (chunks {states}; pid {old}), down "
        f"{downtime:.1f}s, restarted",
    )
    return ["postgres"]


def _log_running_xacts(case: Case, times: int) -> None:
    with psycopg.connect(libpq_url(case.db_url), autocommit=True) as conn:
        for _ in range(times):
            conn.execute("SELECT pg_log_standby_snapshot()")


def test_cdc_snapshot_survives_a_postgres_restart(postgres: tuple[OwnPostgres, Path]) -> None:
    case = Case(postgres, "cdc_snapshot", "public.cdc_snapshot")
    sluice(case.env, case.work, "db", "upgrade")
    create_table(case.engine, case.table, rows=SNAPSHOT_ROWS)
    log(f"discover: {case.discover()}")
    chunks = sum(chunk_states(case.engine, case.pipeline).values())
    assert chunks == 8, chunks
    l0, _, _ = case.slot()
    seed = SEED + 1
    chaos = Chaos(seed, [])
    log(f"seed {seed}; {SNAPSHOT_ROWS:,} rows in {chunks} chunks; slot start L0 {l0}")
    driver = stream_driver(chaos, case.env, case.work, case.server, case.db_url, case.pipeline)
    writer = case.writer(seed)
    watch = SlotWatch(case.db_url, "sluice_cdc_snapshot", case.pipeline, l0)
    writer.start()  # changes during the snapshot, and across the crash
    watch.start()
    with chaos_session(driver, "cdc_snapshot", [writer, watch], kinds=False):
        run = driver.start_run()
        driver.finish_run(run, _crash_during_snapshot(case, driver, chunks, run))
        time.sleep(LEASE_SECONDS + 1)  # whatever the run left leased comes back
        writer.stop()
        log(f"writer stopped: {writer.ops}, {writer.reconnects} reconnects")
        # Transactions the crash cut short end, for the decoder, only after the first
        # running-transactions record past the crash has offered its restart point: the
        # slot's restart_lsn can pass them at the second such record. The server logs one
        # every 15 s of activity; this short case may hold a single one, so two are logged
        # here, before the last run (whose committed offset then passes them).
        _log_running_xacts(case, times=2)
        case.drain(driver)
    assert [kill.kind for kill in chaos.kills] == ["postgres"]
    assert writer.reconnects >= 1 and writer.ops.get("delete") and writer.ops.get("rekey")
    case.verdict("cdc_snapshot")
    _assert_slot(case, watch)
