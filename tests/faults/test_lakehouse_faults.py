"""Exactly-once into a lakehouse table under faults: the clickstream and orders examples with
their sink replaced by the Delta sink (``lakehouse_pipelines``), through the ``sluice`` CLI
in subprocesses against a Postgres server of the test's own (``fault_harness``).

- Seeded random SIGKILLs of Spark Python workers and the driver and Postgres crash-restarts,
  then runs until everything is committed (``extended``): the table, read by delta-rs AND by
  DuckDB over the log's current files, equals the oracle (duplicates 0, missing 0); every app
  transaction version is in the log at most once, and the log's versions of each run are
  exactly the checkpoints (with files) that Postgres committed — the last one of each run
  among them.
- Deterministic kill points, no product-code hook (a connector subclass in the test's
  pipeline module): SIGKILL of the driver (a) after the files are staged and the checkpoint
  committed in Postgres, before the Delta commit, (b) after the Delta commit, before the
  transactions are marked published. A plain re-run recovers: exact output, and that
  checkpoint's version in the log exactly once. About 20 s each: the smoke variant.
- Orphans: files of attempts that died before acknowledging are in the table folder, named by
  no log entry; after the kill runs they are counted here (pending ones excluded: none may be
  left once every transaction is published) and the maintenance's orphan removal with grace
  0 must remove exactly them; the table still equals the oracle.

``SLUICE_FAULTS_SEED=<n>`` replays a schedule; ``SLUICE_FAULTS_KEEP=1`` keeps the folders.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import date, timedelta
from pathlib import Path

import pytest
import sqlalchemy as sa
from fault_harness import (
    REPO,
    Chaos,
    Driver,
    OwnPostgres,
    Run,
    expected_events,
    log,
    make_root,
    remove,
    sluice,
    sluice_env,
    verify,
    wait_gone,
)
from lakehouse_oracle import (
    delta_commits,
    delta_reads,
    load_into_postgres,
    pending_paths,
    published_checkpoints,
    to_folder,
    unreferenced_files,
)
from orders_oracle import landed_orders, verify_orders

from enumerator_service._database import asyncpg_dsn
from examples._clickstream_data import DemoSpec, generate_events, load_users
from spark_jobs.connectors.delta import DeltaMaintenance

pytestmark = [pytest.mark.faults, pytest.mark.spark, pytest.mark.timeout(900)]

SEED = int(os.environ.get("SLUICE_FAULTS_SEED", "20260101")) + 40
MODULE = "tests.faults.lakehouse_pipelines"
LEASE_SECONDS = 4.0
KINDS = {"worker", "driver", "postgres"}
PLAN = ["worker"] * 2 + ["driver"] * 2 + ["postgres"] * 2
USERS = 20_000
MAX_TOP_UPS = 12


@dataclass(frozen=True)
class Case:
    """One pipeline into one table format: its name, table folder and landing."""

    sink: str  # "delta" (Iceberg: one more once it lands)
    pipeline: str
    table: str  # relative to the warehouse
    landing: str  # relative to the data folder


CASES = {
    "clickstream-delta": Case("delta", "clickstream_delta", "lake/enriched_events", "events"),
    "orders-delta": Case("delta", "orders_delta", "lake/orders_enriched", "orders_delta"),
    # ICEBERG HOOK: "clickstream-iceberg"/"orders-iceberg" Cases (IcebergSink pipelines in
    # lakehouse_pipelines.py, snapshot-summary reads in lakehouse_oracle.py) once it lands.
}


@pytest.fixture
def fault_root(request: pytest.FixtureRequest) -> Iterator[tuple[Path, OwnPostgres]]:
    root = make_root()
    server = OwnPostgres(root)
    log(f"own Postgres in {root} ({server.url})")
    failed_before = request.session.testsfailed
    try:
        yield root, server
    finally:
        server.stop()
        if request.session.testsfailed > failed_before or os.environ.get("SLUICE_FAULTS_KEEP"):
            log(f"kept {root} (run logs under run/logs, Postgres log in pg/log)")
        else:
            remove(root)


def _env(work: Path, db_url: str, orders: bool) -> dict[str, str]:
    python_path = os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])
    return sluice_env(
        {
            "SLUICE_DATABASE_URL": db_url,
            "SLUICE_PIPELINES": MODULE,
            "SLUICE_HOME": str(work / "home"),
            "SLUICE_DATA_DIR": str(work / "data"),
            "SLUICE_SPARK_MASTER": "local[2]",
            "SLUICE_PARALLELISM": "2",
            "SLUICE_LEASE_SECONDS": str(LEASE_SECONDS),
            "SLUICE_CHECKPOINT_INTERVAL_SECONDS": "1",
            "SLUICE_CHECKPOINT_TIMEOUT_SECONDS": "20",
            "SLUICE_LOOKUP_TIMEOUT_SECONDS": "20",
            "SLUICE_TARGET_SPLIT_BYTES": str((32 if orders else 256) << 10),
            "SLUICE_READ_BLOCK_BYTES": str((8 if orders else 64) << 10),
            "PYTHONPATH": python_path,
        },
        work,
    )


class Lander:
    """Lands batches (a stream that keeps arriving) and registers them (``sluice discover``)."""

    def __init__(self, env: dict[str, str], work: Path, case: Case, chaos: Chaos) -> None:
        self.env, self.work, self.case, self.chaos = env, work, case, chaos
        self.batches: list[int] = []
        self.landing = work / "data" / "landing" / case.landing

    def __call__(self, first_size: int = 0) -> bool:
        if len(self.batches) > MAX_TOP_UPS:
            return False
        first = not self.batches
        start = date(2026, 1, 1) + timedelta(days=len(self.batches) + (not first))
        orders = self.case.pipeline.startswith("orders")
        base = (6_000 if orders else 60_000) if first else (3_000 if orders else 30_000)
        last = self.batches[-1] if len(self.batches) > 1 else base
        size = first_size or (base if first else self.chaos.next_batch_size(last, base * 64))
        if orders:
            demo = {
                "SLUICE_DEMO_EVENTS": str(size),
                "SLUICE_DEMO_DAYS": str(2 if first else 1),
                "SLUICE_DEMO_FILES_PER_DAY": "3",
                "SLUICE_DEMO_USERS": "5000",
                "SLUICE_DEMO_START_DATE": start.isoformat(),
                "SLUICE_DEMO_SEED": str(11 + len(self.batches)),
            }
            sluice({**self.env, **demo}, self.work, "demo-data", self.case.pipeline)
        else:
            spec = DemoSpec(
                events=size,
                days=2 if first else 1,
                files_per_day=4,
                users=USERS,
                start_date=start,
                seed=7 + len(self.batches),
            )
            generate_events(self.landing, spec)
        self.batches.append(size)
        said = sluice(self.env, self.work, "discover", self.case.pipeline).strip()
        log(f"landed {size:,} records from {start}; {said}")
        return True


def _prepare(root: Path, server: OwnPostgres, case: Case, chaos: Chaos, name: str) -> Lander:
    work = root / name
    work.mkdir()
    db_url = server.create_database(f"faults_{name}")
    orders = case.pipeline.startswith("orders")
    env = _env(work, db_url, orders)
    sluice(env, work, "db", "upgrade")
    if not orders:
        load_users(
            asyncpg_dsn(db_url), schema="public", table="users", key="id", users=USERS, seed=7
        )
    return Lander(env, work, case, chaos)


def _check_table(lander: Lander, db_url: str, label: str) -> None:
    """The table equals the oracle by both reads; the log's app transactions are each once
    and exactly the checkpoints Postgres committed with files (all of them published)."""
    case, work = lander.case, lander.work
    table = work / "data" / "warehouse" / case.table
    reads = delta_reads(table)
    if case.pipeline.startswith("orders"):
        landed = landed_orders(lander.landing)
        for reader, rows in reads.items():
            twice = load_into_postgres(db_url, rows, reader.replace("-", "_"))
            verdict = verify_orders(
                db_url,
                case.pipeline,
                landed,
                table=f"lake_read.{reader.replace('-', '_')}",
                staged=None,
            )
            print(f"{verdict.line(f'{label} {reader}')} key_duplicates={twice}", flush=True)
            assert twice == 0 and verdict.missing == 0 and verdict.unexpected == 0
            assert verdict.wrong == 0 and verdict.rows == verdict.expected_rows
            assert verdict.dead_letters == verdict.expected_dead_letters
    else:
        expected = expected_events(lander.landing)
        for reader, rows in reads.items():
            folder = to_folder(rows, work / f"read-{reader}")
            verdict = verify(folder, db_url, case.pipeline, expected)
            print(verdict.line(f"{label} {reader}"), flush=True)
            assert verdict.duplicates == 0 and verdict.missing == 0
            assert verdict.unexpected == 0 and verdict.wrong == 0
            assert verdict.dead_letters == verdict.malformed
    commits = delta_commits(table)
    by_app = commits.versions_by_app()
    runs = published_checkpoints(db_url, case.pipeline)
    print(
        f"RESULT {label} versions: {sum(len(v) for v in by_app.values())} app-transaction "
        f"commits in {len(commits.txns)} log versions, {len(by_app)} runs with commits, "
        f"committed twice: {commits.once()}",
        flush=True,
    )
    assert commits.once() == []
    for run_id, run in runs.items():
        assert run["unpublished"] == 0, f"run {run_id}: committed, never published"
        versions = by_app.get(f"sluice-{case.pipeline}-{run_id}", [])
        assert versions == sorted(versions), f"run {run_id}: versions out of order {versions}"
        # Each log version is a checkpoint Postgres committed with files, and the run's last
        # such checkpoint is in the log (a recovery may fold several into one commit).
        assert set(versions) <= run["checkpoints"], (run_id, versions, run["checkpoints"])
        if run["checkpoints"]:
            assert versions and versions[-1] == max(run["checkpoints"]), (run_id, versions)


@pytest.mark.extended
@pytest.mark.parametrize("name", list(CASES))
def test_lakehouse_exactly_once_under_kills(
    fault_root: tuple[Path, OwnPostgres], name: str
) -> None:
    root, server = fault_root
    case = CASES[name]
    chaos = Chaos(SEED + len(name), list(PLAN))
    lander = _prepare(root, server, case, chaos, name.replace("-", "_"))
    db_url = lander.env["SLUICE_DATABASE_URL"]
    lander()
    driver = Driver(
        chaos,
        lander.env,
        lander.work,
        server,
        db_url,
        case.pipeline,
        LEASE_SECONDS,
        top_up=lander,
    )
    started = time.monotonic()
    try:
        driver.spend_budget()
        driver.drain()
    finally:
        driver.close()
        print(chaos.timeline(), flush=True)
    log(
        f"{name}: {len(chaos.kills)} kills, {len(chaos.runs)} runs, "
        f"{time.monotonic() - started:.1f}s, {sum(lander.batches):,} records landed"
    )
    assert {kill.kind for kill in chaos.kills} == KINDS
    _check_table(lander, db_url, name)
    _check_orphan_removal(lander, db_url, name)


def _check_pending_kept(lander: Lander, db_url: str) -> None:
    """Right after a kill before the Delta commit, the checkpoint's files are in the folder,
    unreferenced but pending (committed in Postgres): the orphan removal (grace 0) must keep
    every one of them and remove only the rest (an attempt that died before acknowledging)."""
    table = lander.work / "data" / "warehouse" / lander.case.table
    unreferenced = unreferenced_files(table, delta_commits(table))
    pending = pending_paths(db_url, lander.case.pipeline) & unreferenced
    assert pending, "the kill left no staged file of the committed checkpoint"
    engine = sa.create_engine(sa.make_url(db_url).set(drivername="postgresql+psycopg"))
    try:
        result = DeltaMaintenance(str(table), None, engine).remove_orphans(timedelta(0))
    finally:
        engine.dispose()
    left = unreferenced_files(table, delta_commits(table))
    print(
        f"RESULT kill-before orphans: {len(unreferenced)} unreferenced, {len(pending)} of them "
        f"pending; removed {result.orphans_removed}, pending kept {result.pending_kept}",
        flush=True,
    )
    assert result.pending_kept == len(pending) and left == pending
    assert result.orphans_removed == len(unreferenced - pending)


def _check_orphan_removal(lander: Lander, db_url: str, label: str) -> None:
    """Count the unreferenced files; the maintenance's removal (grace 0) takes exactly them."""
    table = lander.work / "data" / "warehouse" / lander.case.table
    orphans = unreferenced_files(table, delta_commits(table))
    engine = sa.create_engine(sa.make_url(db_url).set(drivername="postgresql+psycopg"))
    try:
        result = DeltaMaintenance(str(table), None, engine).remove_orphans(timedelta(0))
    finally:
        engine.dispose()
    after = unreferenced_files(table, delta_commits(table))
    print(
        f"RESULT {label} orphans: {len(orphans)} unreferenced files before, "
        f"{result.orphans_removed} removed, {result.pending_kept} pending kept, "
        f"{result.young_kept} young kept, {len(after)} left",
        flush=True,
    )
    assert result.pending_kept == 0 and result.young_kept == 0
    assert result.orphans_removed == len(orphans) and after == set()
    _check_table(lander, db_url, f"{label} after orphan removal")


# The smoke variant (`make test`): "before"; "after" is `extended`.
@pytest.mark.parametrize("point", ["before", pytest.param("after", marks=pytest.mark.extended)])
def test_driver_killed_around_the_delta_commit_recovers_exactly(
    fault_root: tuple[Path, OwnPostgres], point: str
) -> None:
    """SIGKILL of the driver at the first publish with files; a plain re-run recovers."""
    root, server = fault_root
    case = Case("delta", "clickstream_delta_kill", "lake/enriched_events_kill", "events")
    lander = _prepare(root, server, case, Chaos(SEED, []), f"kill_{point}")
    db_url = lander.env["SLUICE_DATABASE_URL"]
    lander(first_size=6_000)
    table = lander.work / "data" / "warehouse" / case.table
    killed = Run(1, {**lander.env, "SLUICE_TEST_KILL_AT": f"{point}:1"}, lander.work, case.pipeline)
    rc = killed.wait(180)
    assert rc == -9, f"the run was not killed at its publish (exit {rc}):\n{killed.output()}"
    assert not wait_gone(killed.session(), 30), "the killed run's processes outlived it"
    # What the kill left: one checkpoint committed in Postgres, not published.
    runs = published_checkpoints(db_url, case.pipeline)
    (run_id,) = runs
    assert runs[run_id]["unpublished"] > 0 and runs[run_id]["checkpoints"]
    checkpoint = max(runs[run_id]["checkpoints"])
    app = f"sluice-{case.pipeline}-{run_id}"
    before = delta_commits(table).versions_by_app().get(app, [])
    assert before == ([checkpoint] if point == "after" else []), before
    if point == "before":
        _check_pending_kept(lander, db_url)
    time.sleep(LEASE_SECONDS + 1)
    driver = Driver(
        Chaos(SEED, []), lander.env, lander.work, server, db_url, case.pipeline, LEASE_SECONDS
    )
    driver._number = 1
    try:
        driver.drain()
    finally:
        driver.close()
    after = delta_commits(table).versions_by_app().get(app, [])
    print(
        f"RESULT kill {point} the Delta commit: checkpoint {checkpoint} of the killed run in "
        f"the log {after.count(checkpoint)} time(s), versions {after}",
        flush=True,
    )
    assert after.count(checkpoint) == 1 and after[-1] == checkpoint
    _check_table(lander, db_url, f"kill-{point}")
