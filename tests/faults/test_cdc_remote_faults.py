"""Exactly-once of a CDC source whose table is on a server of its own (``url_env``) under
faults: the sink (on the platform's server) equals the source table after SIGKILLed Spark
workers and drivers, a crash of the platform's Postgres and a crash of the source's
Postgres, while a writer keeps changing the table.

- ``cdc_remote``: a 20k-row table on the source server; the snapshot read fault-free, then
  the stream, in repeated bounded `sluice run`s (a `sluice discover` before each) under a
  concurrent writer (``tests/cdc_oracle.py``'s changes, reconnecting after the source's
  crash). Each kind of fault once, at seeded moments of the stream's runs: ``worker``,
  ``driver``, ``postgres`` (the platform: splits, checkpoints, sink) and ``source`` (the
  server with the table, the publication and the slot). A watcher samples the slot on the
  source server and the committed offsets on the platform's: the slot never passes an
  offset a completed checkpoint committed. After the writer stops and fault-free runs drain,
  the sink equals the table.

The oracle is the source table itself, read with the test's own SQL after the writer
stopped. ``SLUICE_FAULTS_SEED=<n>`` replays a schedule.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest
import sqlalchemy as sa
from cdc_faults import CrashProofWriter, SlotWatch, finish_snapshot, slot_offsets
from cdc_oracle import Diff, compare, create_table, libpq_url, rows_of
from cdc_pipelines import REMOTE_TABLE, REMOTE_URL_ENV
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
)

pytestmark = [
    pytest.mark.faults,
    pytest.mark.extended,
    pytest.mark.spark,
    pytest.mark.timeout(1200),
]

MODULE = "tests.faults.cdc_pipelines"
PIPELINE = "cdc_remote"
SLOT = f"sluice_{PIPELINE}"
PLAN = ["worker", "driver", "postgres", "source"]
ROWS = 20_000
MAX_TOP_UPS = 30
#: Seconds the source server stays down (see ``SourceDriver._kill``).
SOURCE_DOWNTIME = (5.0, 10.0)


@pytest.fixture(scope="module")
def platform_server(request: pytest.FixtureRequest) -> Iterator[tuple[OwnPostgres, Path]]:
    with own_postgres(request) as server_and_root:
        yield server_and_root


@pytest.fixture(scope="module")
def source_server(request: pytest.FixtureRequest) -> Iterator[tuple[OwnPostgres, Path]]:
    with own_postgres(request, logical=True) as server_and_root:
        yield server_and_root


@dataclass
class SourceDriver(Driver):
    """The harness's driver, with one more kind of fault: the source server crashes."""

    source: OwnPostgres | None = None

    def _kill(self, run: Run, kind: str) -> str:
        if kind != "source":
            return super()._kill(run, kind)
        assert self.source is not None
        # Longer than Spark's task attempts last without waiting (4 in ~3 s: a trial's run
        # failed so), shorter than the readers' patience (CONNECT_PATIENCE, 30 s).
        downtime = self.chaos.rng.uniform(*SOURCE_DOWNTIME)
        old = self.source.postmaster_pid()
        self.source.restart(downtime)
        return f"source Postgres crash (immediate stop, pid {old}), down {downtime:.1f}s"


def test_cdc_from_its_own_server_sink_equals_table_under_kills(
    platform_server: tuple[OwnPostgres, Path], source_server: tuple[OwnPostgres, Path]
) -> None:
    platform, root = platform_server
    source, _ = source_server
    work = root / PIPELINE
    work.mkdir()
    db_url = platform.create_database("faults_cdc_remote")
    source_url = source.create_database("shop")
    env = sluice_env({**run_settings(work, db_url, MODULE), "PYTHONPATH": python_path()}, work)
    env[REMOTE_URL_ENV] = libpq_url(source_url)
    table = sa.create_engine(  # no pool: a pooled connection would not survive the crashes
        sa.make_url(source_url).set(drivername="postgresql+psycopg"), poolclass=sa.pool.NullPool
    )
    sink = sa.create_engine(
        sa.make_url(db_url).set(drivername="postgresql+psycopg"), poolclass=sa.pool.NullPool
    )
    discoveries = 0

    def discover() -> None:
        nonlocal discoveries
        discoveries += 1
        log(f"discover: {sluice(env, work, 'discover', PIPELINE).strip()}")

    def diff() -> Diff:
        return compare(rows_of(table, REMOTE_TABLE), rows_of(sink, f"{REMOTE_TABLE}_out"))

    def top_up() -> bool:
        if discoveries > MAX_TOP_UPS:
            return False
        discover()
        return True

    sluice(env, work, "db", "upgrade")
    create_table(table, REMOTE_TABLE, rows=ROWS)
    discover()
    with (
        psycopg.connect(libpq_url(source_url), autocommit=True) as on_slot,
        psycopg.connect(libpq_url(db_url), autocommit=True) as on_platform,
    ):
        l0, _, _ = slot_offsets(on_slot, SLOT, PIPELINE, on_platform)
    chaos = Chaos(SEED + 2, list(PLAN))
    log(f"seed {SEED + 2}; slot start L0 {l0} on the source server")
    driver = SourceDriver(
        chaos, env, work, platform, db_url, PIPELINE, LEASE_SECONDS, top_up=top_up, source=source
    )
    driver.start_timeout = driver.run_timeout = SPARK_START
    writer = CrashProofWriter(
        source_url, REMOTE_TABLE, first_new_key=10_000_000, pause=0.005, seed=SEED + 2
    )
    watch = SlotWatch(db_url, SLOT, PIPELINE, l0, slot_url=source_url)
    writer.start()
    watch.start()
    with chaos_session(driver, PIPELINE, [writer, watch], kinds=False):
        finish_snapshot(driver, sink, PIPELINE)
        discover()  # the stream split
        driver.spend_budget()
        writer.stop()
        log(f"writer stopped: {writer.ops}, {writer.reconnects} reconnects")
        drain_stream(driver, discover, lambda: diff().equal, lambda: f"; {diff()}")
    assert sorted(k.kind for k in chaos.kills) == sorted(PLAN)
    assert writer.reconnects >= 1  # the writer met the source's crash
    assert writer.ops.get("delete") and writer.ops.get("rekey") and writer.ops.get("txn")
    result = diff()
    rows = len(rows_of(table, REMOTE_TABLE))
    print(
        f"RESULT cdc_remote: table_rows={rows} missing={len(result.missing)} "
        f"extra={len(result.extra)} duplicates={len(result.duplicates)} "
        f"differing={len(result.differing)} splits={split_counts(db_url, PIPELINE)}",
        flush=True,
    )
    assert result.equal, str(result)
    assert watch.error is None, watch.error
    log(
        f"slot watch: {len(watch.samples)} samples, {len(watch.violations)} past a committed offset"
    )
    assert len(watch.samples) > 20 and watch.violations == [], watch.violations[:5]
    table.dispose()
    sink.dispose()
