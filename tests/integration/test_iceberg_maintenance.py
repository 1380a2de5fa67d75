"""Iceberg table maintenance (``spark_jobs.connectors.iceberg._maintenance``) on real tables:
a PyIceberg SQL catalog on the test Postgres, the warehouse in ``tmp_path`` (and one test on
the S3-protocol server), filled by many small appends (one file and one snapshot each).

The oracle is the rows appended (``lakehouse_tables``); the table's content is read back by
DuckDB from the files the current snapshot names: duplicates = 0, missing = 0.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import duckdb
import pytest
import sqlalchemy as sa
from lakehouse_tables import (
    DAYS,
    append_rows,
    assert_same_rows,
    iceberg_catalog,
    iceberg_rows,
    make_iceberg_table,
    mark_published,
    pg_engine,
    record_transaction,
)
from pyiceberg.exceptions import ValidationException
from s3_server import S3Server, s3_server

from spark_jobs.connectors import CompactionResult
from spark_jobs.connectors.iceberg import _compaction as compaction
from spark_jobs.connectors.iceberg._maintenance import (
    COMPACTION_PROPERTY,
    compact_day,
    expire_snapshots,
    lock_id,
    remove_orphans,
)
from spark_jobs.sink import table_lock


@pytest.fixture
def engine(db_url: str) -> Iterator[sa.Engine]:
    engine = pg_engine(db_url)
    yield engine
    engine.dispose()


def test_compaction_rewrites_a_day_in_one_snapshot_and_twice_is_a_no_op(
    db_url: str, engine: sa.Engine, tmp_path: Path
) -> None:
    table, oracle = make_iceberg_table(iceberg_catalog(db_url, f"file://{tmp_path}"), 6)
    day, other = DAYS
    snapshots = len(table.metadata.snapshots)
    _, before = iceberg_rows(table)
    assert len(before) == 12

    done = compact_day(table, engine, day)

    assert (done.files_before, done.files_after, done.skipped) == (6, 1, False)
    assert done.rows == sum(1 for row in oracle if row[1] == day) == 120
    table.refresh()
    assert len(table.metadata.snapshots) == snapshots + 1  # ONE snapshot
    current = table.current_snapshot()
    assert current is not None and current.snapshot_id == done.snapshot
    assert current.summary is not None
    assert current.summary[COMPACTION_PROPERTY] == day.isoformat()
    found, after = iceberg_rows(table)
    assert_same_rows(found, oracle)
    assert len(after) == 7  # the day's 6 files are 1; the other day's 6 untouched
    assert sorted(p for p in after if f"dt={other}" in p) == sorted(
        p for p in before if f"dt={other}" in p
    )

    again = compact_day(table, engine, day)
    assert (again.skipped, again.snapshot, again.files_before) == (True, None, 1)
    table.refresh()
    assert len(table.metadata.snapshots) == snapshots + 1
    assert_same_rows(iceberg_rows(table)[0], oracle)


def test_compaction_waits_for_a_commit_holding_the_lock(
    db_url: str, engine: sa.Engine, tmp_path: Path
) -> None:
    catalog = iceberg_catalog(db_url, f"file://{tmp_path}")
    table, oracle = make_iceberg_table(catalog, 4)
    day = DAYS[0]
    committer = catalog.load_table(table.name())
    results: list[CompactionResult] = []
    locked = threading.Event()
    release = threading.Event()

    def commit_holding_the_lock() -> None:
        # A Sluice committer: the lock, then (while the compaction waits) a commit of the day.
        with table_lock(engine, lock_id(committer)):
            locked.set()
            release.wait(10)
            oracle.extend(append_rows(committer, 10_000, 20, day))

    holder = threading.Thread(target=commit_holding_the_lock)
    holder.start()
    assert locked.wait(10)
    compactor = threading.Thread(target=lambda: results.append(compact_day(table, engine, day)))
    compactor.start()
    time.sleep(1.0)
    assert results == [] and compactor.is_alive()  # blocked on the lock
    release.set()
    holder.join(10)
    compactor.join(20)

    [done] = results
    # It planned after the commit: the committed file is compacted with the others.
    assert done.files_before == 5 and done.files_after == 1
    found, _ = iceberg_rows(table)
    assert_same_rows(found, oracle)  # the concurrent commit's rows are there, once


def test_expiry_keeps_the_current_and_the_young_snapshots(
    db_url: str, engine: sa.Engine, tmp_path: Path
) -> None:
    table, oracle = make_iceberg_table(iceberg_catalog(db_url, f"file://{tmp_path}"), 3)
    compact_day(table, engine, DAYS[0])
    table.refresh()
    snapshots = table.metadata.snapshots
    assert len(snapshots) == 7
    # "now" such that the first 3 snapshots are older than a 1-hour retention.
    now = datetime.fromtimestamp(snapshots[2].timestamp_ms / 1000, UTC) + timedelta(
        hours=1, milliseconds=1
    )
    kept = [s.snapshot_id for s in snapshots[3:]]

    done = expire_snapshots(table, engine, timedelta(hours=1), now=now)

    assert (done.snapshots_before, done.snapshots_after) == (7, 4)
    assert [s.snapshot_id for s in table.metadata.snapshots] == kept
    assert_same_rows(iceberg_rows(table)[0], oracle)
    metadata = table.metadata_location
    assert expire_snapshots(table, engine, timedelta(hours=1), now=now).snapshots_after == 4
    table.refresh()
    assert table.metadata_location == metadata  # nothing committed the second time

    # A zero retention expires all but the current one.
    current = table.current_snapshot()
    assert current is not None
    last = expire_snapshots(table, engine, timedelta(0))
    assert (last.snapshots_after, last.current) == (1, current.snapshot_id)
    assert_same_rows(iceberg_rows(table)[0], oracle)


def test_orphans_older_than_the_grace_are_removed_young_ones_kept(
    db_url: str, engine: sa.Engine, tmp_path: Path
) -> None:
    table, oracle = make_iceberg_table(iceberg_catalog(db_url, f"file://{tmp_path}"), 3)
    day_folder = Path(table.location().removeprefix("file://")) / "data" / f"dt={DAYS[0]}"
    stray_old = day_folder / "failed-attempt-old.parquet"
    stray_young = day_folder / "checkpoint-in-flight.parquet"
    for stray in (stray_old, stray_young):
        stray.write_bytes(b"PAR1 not committed")
    two_hours_ago = time.time() - 7200
    os.utime(stray_old, (two_hours_ago, two_hours_ago))

    done = remove_orphans(table, engine, timedelta(hours=1))

    assert (done.files_seen, done.orphans_removed, done.young_kept) == (8, 1, 1)
    assert done.referenced == 6
    assert not stray_old.exists() and stray_young.exists()
    assert_same_rows(iceberg_rows(table)[0], oracle)

    # Compaction + expiry leave the day's 3 old files to nobody: taken with a zero grace.
    compact_day(table, engine, DAYS[0])
    expire_snapshots(table, engine, timedelta(0))
    swept = remove_orphans(table, engine, timedelta(0))
    assert (swept.orphans_removed, swept.young_kept, swept.referenced) == (4, 0, 4)
    found, paths = iceberg_rows(table)
    assert_same_rows(found, oracle)
    assert all(Path(p.removeprefix("file://")).exists() for p in paths)
    assert remove_orphans(table, engine, timedelta(0)).orphans_removed == 0


@pytest.fixture(scope="module")
def s3() -> Iterator[S3Server]:
    with s3_server() as server:
        yield server


def test_compaction_and_orphans_on_an_object_store(
    db_url: str, engine: sa.Engine, s3: S3Server
) -> None:
    bucket = s3.create_bucket("maint-ice")
    catalog = iceberg_catalog(
        db_url,
        f"{bucket}/warehouse",
        **{
            "s3.endpoint": s3.endpoint_url,
            "s3.region": "us-east-1",
            "s3.access-key-id": "sluice-test-key",
            "s3.secret-access-key": "sluice-test-secret-do-not-log",
        },
    )
    table, oracle = make_iceberg_table(catalog, 3)
    done = compact_day(table, engine, DAYS[1])
    assert (done.files_before, done.files_after) == (3, 1)
    assert_same_rows(iceberg_rows(table)[0], oracle)
    stray = f"{table.location()}/data/dt={DAYS[1]}/stray.parquet"
    with table.io.new_output(stray).create() as out:
        out.write(b"PAR1 not committed")
    expire_snapshots(table, engine, timedelta(0))
    swept = remove_orphans(table, engine, timedelta(0))
    assert (swept.orphans_removed, swept.referenced) == (4, 4)  # 3 compacted away + stray
    assert not table.io.new_input(stray).exists()
    assert_same_rows(iceberg_rows(table)[0], oracle)


def test_a_writer_outside_sluice_wins_and_the_compaction_leaves_nothing(
    db_url: str, engine: sa.Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    catalog = iceberg_catalog(db_url, f"file://{tmp_path}")
    table, oracle = make_iceberg_table(catalog, 3)
    day = DAYS[0]
    outsider = catalog.load_table(table.name())
    write = compaction._write_compacted

    def write_then_commit_outside(*args: Any) -> Any:
        written = write(*args)
        # A writer that does not take the lock commits between planning and commit.
        oracle.extend(append_rows(outsider, 20_000, 20, day))
        return written

    monkeypatch.setattr(compaction, "_write_compacted", write_then_commit_outside)
    with pytest.raises(ValidationException, match="Added data files"):
        compact_day(table, engine, day)

    found, paths = iceberg_rows(table)
    assert_same_rows(found, oracle)  # the outsider's rows and all the others, once
    assert len(paths) == 7
    data = Path(table.location().removeprefix("file://")) / "data"
    assert list(data.rglob("sluice-compact-*")) == []  # the refused files were deleted


def test_a_target_size_makes_a_few_files_and_leaves_files_that_are_not_small(
    db_url: str, engine: sa.Engine, tmp_path: Path
) -> None:
    # 500 rows a file: data, not the footer, makes a file's size (two appends' rows in one
    # file are ~1.7 times one append's file).
    catalog = iceberg_catalog(db_url, f"file://{tmp_path}")
    table, oracle = make_iceberg_table(catalog, 6, per_append=500)
    day = DAYS[0]
    sizes = [t.file.file_size_in_bytes for t in compaction._day_tasks(table, "dt", day)]
    target = 2 * max(sizes) + 600  # every file is small (< target / 2); 6 ≈ 2.7 targets

    done = compact_day(table, engine, day, target_file_bytes=target)

    assert (done.files_before, done.files_after, done.rows) == (6, 3, 3000)
    found, paths = iceberg_rows(table)
    assert_same_rows(found, oracle)
    compacted = sorted(p for p in paths if "sluice-compact-" in p)
    assert len(compacted) == 3
    per_file = duckdb.sql(
        "SELECT count(*) FROM read_parquet($p, filename=true) GROUP BY filename",
        params={"p": [p.removeprefix("file://") for p in compacted]},
    ).fetchall()
    assert sorted(n for (n,) in per_file) == [1000, 1000, 1000]
    assert compact_day(table, engine, day, target_file_bytes=target).skipped  # none small

    # Two new small files: only they are rewritten, the compacted ones stay as they are.
    oracle += append_rows(table, 50_000, 500, day) + append_rows(table, 50_500, 500, day)
    more = compact_day(table, engine, day, target_file_bytes=target)
    assert (more.files_before, more.files_after, more.rows) == (5, 4, 4000)
    found, paths = iceberg_rows(table)
    assert_same_rows(found, oracle)
    assert set(compacted) < set(paths)


def test_a_file_whose_publish_is_still_to_come_is_kept(
    db_url: str, engine: sa.Engine, tmp_path: Path
) -> None:
    table, oracle = make_iceberg_table(iceberg_catalog(db_url, f"file://{tmp_path}"), 2)
    staged = f"{table.location()}/data/dt={DAYS[1]}/00000-checkpoint-9.parquet"
    local = Path(staged.removeprefix("file://"))
    local.write_bytes(b"PAR1 committed in Postgres, not in the table yet")
    os.utime(local, (time.time() - 86_400, time.time() - 86_400))
    txn = record_transaction(engine, "iceberg_events", [{"staged": staged}], published=False)

    kept = remove_orphans(table, engine, timedelta(hours=1))
    assert (kept.orphans_removed, kept.pending_kept, kept.referenced) == (0, 1, 4)
    assert local.exists()

    mark_published(engine, txn)
    swept = remove_orphans(table, engine, timedelta(hours=1))
    assert (swept.orphans_removed, swept.pending_kept) == (1, 0)
    assert not local.exists()
    assert_same_rows(iceberg_rows(table)[0], oracle)
