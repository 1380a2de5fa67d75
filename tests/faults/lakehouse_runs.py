"""The runs of the lakehouse fault tests (``test_lakehouse_faults.py``): their settings,
the landing of batches (clickstream: ``generate_events``; orders: ``sluice demo-data``), and
the checks after them — the table against the oracle by two readers, the log's app
transactions against the checkpoints Postgres committed, the orphan removal.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import date, timedelta
from pathlib import Path

import pyarrow as pa
import sqlalchemy as sa
from fault_harness import (
    REPO,
    Chaos,
    OwnPostgres,
    expected_events,
    log,
    sluice,
    sluice_env,
    verify,
)
from kill_cases import LEASE_SECONDS, run_settings
from lakehouse_oracle import (
    Commits,
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
from spark_jobs.connectors import OrphanResult
from spark_jobs.connectors.delta import DeltaMaintenance

__all__ = [
    "LEASE_SECONDS",
    "Case",
    "Lander",
    "check_orphan_removal",
    "check_pending_kept",
    "check_table",
    "prepare",
    "view",
]

MODULE = "tests.faults.lakehouse_pipelines"
USERS = 20_000
MAX_TOP_UPS = 12


@dataclass(frozen=True)
class Case:
    """One pipeline into one table format: its name, table folder and landing."""

    sink: str  # "delta" | "iceberg"
    pipeline: str
    table: str  # delta: a folder relative to the warehouse; iceberg: "namespace.name"
    landing: str  # relative to the data folder
    event_time: str = "event_time"  # the day of a row (an Iceberg table has no dt column)


class View:
    """A case's table as the checks see it (``DeltaView``, ``IcebergView``)."""

    def reads(self) -> dict[str, pa.Table]:
        raise NotImplementedError

    def commits(self) -> Commits:
        raise NotImplementedError

    def unreferenced(self) -> set[str]:
        raise NotImplementedError

    def remove_orphans(self) -> OrphanResult:
        raise NotImplementedError


class DeltaView(View):
    def __init__(self, folder: Path, db_url: str) -> None:
        self.folder, self.db_url = folder, db_url

    def reads(self) -> dict[str, pa.Table]:
        return delta_reads(self.folder)

    def commits(self) -> Commits:
        return delta_commits(self.folder)

    def unreferenced(self) -> set[str]:
        return {str(self.folder / p) for p in unreferenced_files(self.folder, self.commits())}

    def remove_orphans(self) -> OrphanResult:
        engine = sa.create_engine(sa.make_url(self.db_url).set(drivername="postgresql+psycopg"))
        try:
            return DeltaMaintenance(str(self.folder), None, engine).remove_orphans(timedelta(0))
        finally:
            engine.dispose()


class IcebergView(View):
    def __init__(self, case: Case, db_url: str) -> None:
        from lakehouse_iceberg import iceberg_table

        self.case, self.db_url = case, db_url
        self.table = iceberg_table(db_url, case.table)

    def reads(self) -> dict[str, pa.Table]:
        from lakehouse_iceberg import iceberg_reads

        self.table.refresh()
        return iceberg_reads(self.table, self.case.event_time)

    def commits(self) -> Commits:
        from lakehouse_iceberg import iceberg_commits

        self.table.refresh()
        return iceberg_commits(self.table, self.case.pipeline)

    def unreferenced(self) -> set[str]:
        from lakehouse_iceberg import iceberg_unreferenced

        return iceberg_unreferenced(self.table)

    def remove_orphans(self) -> OrphanResult:
        from lakehouse_iceberg import iceberg_remove_orphans

        result: OrphanResult = iceberg_remove_orphans(self.table, self.db_url)
        return result


def view(lander: Lander, db_url: str) -> View:
    """The table of ``lander``'s case."""
    if lander.case.sink == "iceberg":
        return IcebergView(lander.case, db_url)
    return DeltaView(lander.work / "data" / "warehouse" / lander.case.table, db_url)


def _env(work: Path, db_url: str, orders: bool) -> dict[str, str]:
    python_path = os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])
    return sluice_env(
        {
            **run_settings(work, db_url, MODULE),
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


def prepare(root: Path, server: OwnPostgres, case: Case, chaos: Chaos, name: str) -> Lander:
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


def check_table(lander: Lander, db_url: str, label: str) -> None:
    """The table equals the oracle by both reads; the log's app transactions are each once
    and exactly the checkpoints Postgres committed with files (all of them published)."""
    case, work = lander.case, lander.work
    table = view(lander, db_url)
    reads = table.reads()
    if case.pipeline.startswith("orders"):
        landed = landed_orders(lander.landing)
        for reader, rows in reads.items():
            twice = load_into_postgres(db_url, rows, reader.replace("-", "_"))
            orders = verify_orders(
                db_url,
                case.pipeline,
                landed,
                table=f"lake_read.{reader.replace('-', '_')}",
                staged=False,
            )
            print(f"{orders.line(f'{label} {reader}')} key_duplicates={twice}", flush=True)
            assert twice == 0 and orders.missing == 0 and orders.unexpected == 0
            assert orders.wrong == 0 and orders.rows == orders.expected_rows
            assert orders.dead_letters == orders.expected_dead_letters
    else:
        expected = expected_events(lander.landing)
        for reader, rows in reads.items():
            folder = to_folder(rows, work / f"read-{reader}")
            verdict = verify(folder, db_url, case.pipeline, expected)
            print(verdict.line(f"{label} {reader}"), flush=True)
            assert verdict.duplicates == 0 and verdict.missing == 0
            assert verdict.unexpected == 0 and verdict.wrong == 0
            assert verdict.dead_letters == verdict.malformed
    commits = table.commits()
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


def check_pending_kept(lander: Lander, db_url: str) -> None:
    """Right after a kill before the table commit, the checkpoint's files are in the folder,
    unreferenced but pending (committed in Postgres): the orphan removal (grace 0) must keep
    every one of them and remove only the rest (an attempt that died before acknowledging)."""
    table = view(lander, db_url)
    unreferenced = table.unreferenced()
    pending = pending_paths(db_url, lander.case.pipeline) & unreferenced
    assert pending, "the kill left no staged file of the committed checkpoint"
    result = table.remove_orphans()
    left = table.unreferenced()
    print(
        f"RESULT kill-before orphans: {len(unreferenced)} unreferenced, {len(pending)} of them "
        f"pending; removed {result.orphans_removed}, pending kept {result.pending_kept}",
        flush=True,
    )
    assert result.pending_kept == len(pending) and left == pending
    assert result.orphans_removed == len(unreferenced - pending)


def check_orphan_removal(lander: Lander, db_url: str, label: str) -> int:
    """Count the unreferenced files; the maintenance's removal (grace 0) takes exactly them."""
    table = view(lander, db_url)
    orphans = table.unreferenced()
    result = table.remove_orphans()
    after = table.unreferenced()
    print(
        f"RESULT {label} orphans: {len(orphans)} unreferenced files before, "
        f"{result.orphans_removed} removed, {result.pending_kept} pending kept, "
        f"{result.young_kept} young kept, {len(after)} left",
        flush=True,
    )
    assert result.pending_kept == 0 and result.young_kept == 0
    assert result.orphans_removed == len(orphans) and after == set()
    check_table(lander, db_url, f"{label} after orphan removal")
    return len(orphans)
