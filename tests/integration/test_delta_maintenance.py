"""Delta table maintenance (``spark_jobs.connectors.delta._maintenance``) on real tables
written by delta-rs (``write_deltalake``, many small appends: one file and one version
each) in ``tmp_path``, locked through the test Postgres.

The oracle is the rows appended (``lakehouse_tables``); the table's content is read back by
DuckDB from the files the current version names: duplicates = 0, missing = 0.
"""

from __future__ import annotations

import os
import secrets
import threading
import time
from collections.abc import Iterator
from datetime import date, timedelta
from pathlib import Path

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest
import sqlalchemy as sa
from deltalake import DeltaTable, write_deltalake
from lakehouse_tables import (
    DAYS,
    Row,
    assert_same_rows,
    batch,
    delta_rows,
    fill_delta,
    mark_published,
    pg_engine,
    record_transaction,
)
from s3_server import S3Server, s3_server

from spark_jobs.connectors import CompactionResult
from spark_jobs.connectors.delta._maintenance import (
    COMPACTION_PROPERTY,
    DeltaMaintenance,
    compact_day,
    remove_orphans,
    vacuum,
)
from spark_jobs.sink import table_lock


@pytest.fixture
def engine(db_url: str) -> Iterator[sa.Engine]:
    engine = pg_engine(db_url)
    yield engine
    engine.dispose()


def test_compaction_rewrites_a_day_in_one_commit_and_twice_is_a_no_op(
    engine: sa.Engine, tmp_path: Path
) -> None:
    uri = str(tmp_path / "events")
    oracle = fill_delta(uri, 6)
    day, other = DAYS
    version = DeltaTable(uri).version()
    _, before = delta_rows(uri)
    assert len(before) == 12

    done = compact_day(uri, None, engine, day)

    assert (done.files_before, done.files_after, done.skipped) == (6, 1, False)
    assert done.rows == sum(1 for row in oracle if row[1] == day) == 120
    table = DeltaTable(uri)
    assert table.version() == version + 1 == done.snapshot  # ONE commit
    last = table.history(1)[0]
    assert (last["operation"], last[COMPACTION_PROPERTY]) == ("OPTIMIZE", day.isoformat())
    found, after = delta_rows(uri)
    assert_same_rows(found, oracle)
    assert len(after) == 7
    assert sorted(p for p in after if f"dt={other}" in p) == sorted(
        p for p in before if f"dt={other}" in p
    )

    again = compact_day(uri, None, engine, day)
    assert (again.skipped, again.snapshot) == (True, None)
    assert DeltaTable(uri).version() == version + 1


def test_compaction_waits_for_a_commit_holding_the_lock(engine: sa.Engine, tmp_path: Path) -> None:
    uri = str(tmp_path / "events")
    oracle = fill_delta(uri, 3)
    day = DAYS[0]
    results: list[CompactionResult] = []
    locked = threading.Event()
    release = threading.Event()
    late = batch(10_000, 20, day)

    def commit_holding_the_lock() -> None:
        with table_lock(engine, uri):
            locked.set()
            release.wait(10)
            data = late.set_column(1, "dt", pa.array([day.isoformat()] * late.num_rows))
            write_deltalake(uri, data, partition_by=["dt"], mode="append")

    holder = threading.Thread(target=commit_holding_the_lock)
    holder.start()
    assert locked.wait(10)
    compactor = threading.Thread(target=lambda: results.append(compact_day(uri, None, engine, day)))
    compactor.start()
    time.sleep(1.0)
    assert results == [] and compactor.is_alive()
    release.set()
    holder.join(10)
    compactor.join(20)

    [done] = results
    assert done.files_before == 4 and done.files_after == 1
    oracle += list(
        zip(
            late.column("id").to_pylist(),
            late.column("dt").to_pylist(),
            late.column("payload").to_pylist(),
            strict=True,
        )
    )
    assert_same_rows(delta_rows(uri)[0], oracle)


def test_vacuum_removes_files_of_old_versions_only_and_is_idempotent(
    engine: sa.Engine, tmp_path: Path
) -> None:
    uri = str(tmp_path / "events")
    oracle = fill_delta(uri, 3)
    compact_day(uri, None, engine, DAYS[0])
    # A file a run staged and has not committed yet (no log entry names it), old: a VACUUM
    # deletes the files of removed versions only, never such a file, even at retention 0.
    staged = tmp_path / "events" / f"dt={DAYS[0]}" / "part-staged-not-committed.parquet"
    pq.write_table(pa.table({"x": [1]}), staged)
    os.utime(staged, (time.time() - 30 * 86400,) * 2)
    # A long retention: the compaction's tombstones are young, nothing goes.
    kept = vacuum(uri, None, engine, timedelta(days=7))
    assert kept.files_removed == 0
    assert len(list((tmp_path / "events" / f"dt={DAYS[0]}").glob("*.parquet"))) == 5

    done = vacuum(uri, None, engine, timedelta(0))

    assert done.files_removed == 3
    assert staged.exists()
    assert done.current == DeltaTable(uri).version()
    found, paths = delta_rows(uri)
    assert_same_rows(found, oracle)
    assert all(Path(p.removeprefix("file://")).exists() for p in paths)
    version = DeltaTable(uri).version()
    again = vacuum(uri, None, engine, timedelta(0))
    assert again.files_removed == 0
    assert DeltaTable(uri).version() == version  # nothing committed the second time


def test_orphans_older_than_the_grace_are_removed_young_ones_kept(
    engine: sa.Engine, tmp_path: Path
) -> None:
    uri = str(tmp_path / "events")
    oracle = fill_delta(uri, 3)
    folder = tmp_path / "events" / f"dt={DAYS[1]}"
    stray_old = folder / "part-failed-attempt.parquet"
    stray_young = folder / "part-in-flight.parquet"
    for stray in (stray_old, stray_young):
        stray.write_bytes(b"PAR1 not committed")
    two_hours_ago = time.time() - 7200
    os.utime(stray_old, (two_hours_ago, two_hours_ago))
    log_files = sorted((tmp_path / "events" / "_delta_log").iterdir())
    for path in log_files:
        os.utime(path, (two_hours_ago, two_hours_ago))

    done = remove_orphans(uri, None, engine, timedelta(hours=1))

    assert (done.files_seen, done.orphans_removed, done.young_kept) == (8, 1, 1)
    assert not stray_old.exists() and stray_young.exists()
    assert sorted((tmp_path / "events" / "_delta_log").iterdir()) == log_files  # never taken
    assert_same_rows(delta_rows(uri)[0], oracle)

    # Files a compaction removed are still in the log (older versions read them): kept.
    compact_day(uri, None, engine, DAYS[0])
    swept = remove_orphans(uri, None, engine, timedelta(0))
    assert (swept.orphans_removed, swept.referenced) == (1, 7)  # the young stray only
    assert_same_rows(delta_rows(uri)[0], oracle)
    assert remove_orphans(uri, None, engine, timedelta(0)).orphans_removed == 0


@pytest.fixture(scope="module")
def s3() -> Iterator[S3Server]:
    with s3_server(own_process=True) as server:
        yield server


def test_compaction_vacuum_and_orphans_on_an_object_store(
    engine: sa.Engine, s3: S3Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    # delta-rs takes its options; the orphan listing (pyarrow.fs) the standard chain.
    for key, value in s3.env.items():
        monkeypatch.setenv(key, value)
    options = {
        "AWS_ENDPOINT_URL": s3.endpoint_url,
        "AWS_REGION": "us-east-1",
        "AWS_ALLOW_HTTP": "true",
        "AWS_ACCESS_KEY_ID": "sluice-test-key",
        "AWS_SECRET_ACCESS_KEY": "sluice-test-secret-do-not-log",
        "AWS_S3_ALLOW_UNSAFE_RENAME": "true",
    }
    uri = f"{s3.create_bucket('maint-delta')}/warehouse/events"
    oracle = fill_delta(uri, 3, storage_options=options)
    fs = s3.admin()

    def rows() -> list[Row]:
        found: list[Row] = []
        for path in DeltaTable(uri, storage_options=options).file_uris():
            key = path.removeprefix("s3://")
            day = date.fromisoformat(key.split("dt=")[1].split("/")[0])
            data = pq.read_table(key, filesystem=fs)
            found += [
                (i, day, p)
                for i, p in zip(
                    *(data.column(c).to_pylist() for c in ("id", "payload")), strict=True
                )
            ]
        return found

    done = compact_day(uri, options, engine, DAYS[1])
    assert (done.files_before, done.files_after) == (3, 1)
    assert_same_rows(rows(), oracle)
    stray = f"maint-delta/warehouse/events/dt={DAYS[1]}/part-stray.parquet"
    with fs.open_output_stream(stray) as out:
        out.write(b"PAR1 not committed")
    swept = remove_orphans(uri, options, engine, timedelta(0))
    assert (swept.orphans_removed, swept.referenced) == (1, 7)  # 6 appended + 1 compacted
    assert fs.get_file_info(stray).type == pafs.FileType.NotFound
    vacuumed = vacuum(uri, options, engine, timedelta(0))
    assert vacuumed.files_removed == 3
    assert_same_rows(rows(), oracle)
    assert remove_orphans(uri, options, engine, timedelta(0)).orphans_removed == 0
    assert "do-not-log" not in repr(DeltaMaintenance(uri, options, engine))


def test_files_sluice_still_has_to_commit_are_never_orphans(
    engine: sa.Engine, tmp_path: Path
) -> None:
    uri = str(tmp_path / "events")
    oracle = fill_delta(uri, 2)
    source = f"maint_{secrets.token_hex(3)}"
    folder = tmp_path / "events" / f"dt={DAYS[0]}"
    unpublished = folder / "part-checkpoint-committed-publish-failed.parquet"
    rebuilt = folder / "rebuild-7" / "part-rebuild-member.parquet"
    rebuilt.parent.mkdir()
    for path in (unpublished, rebuilt):
        path.write_bytes(b"PAR1 written in place, not in the log yet")
        os.utime(path, (time.time() - 86_400, time.time() - 86_400))  # a day old
    txn = record_transaction(
        engine, source, [{"staged": str(unpublished), "path": unpublished.name}], published=False
    )
    with engine.begin() as conn:
        rebuild = conn.execute(
            sa.text(
                "INSERT INTO sluice.partition_rebuilds (source, partition_key, run_id) "
                "VALUES (:source, :day, 'r') RETURNING id"
            ),
            {"source": source, "day": DAYS[0]},
        ).scalar_one()
    record_transaction(engine, source, [{"final": f"file://{rebuilt}"}], published=True)

    kept = remove_orphans(uri, None, engine, timedelta(hours=1))

    assert (kept.orphans_removed, kept.pending_kept) == (0, 2)
    assert unpublished.exists() and rebuilt.exists()
    # Published (recovery gave up on it: it is an orphan now) and the rebuild abandoned.
    mark_published(engine, txn)
    with engine.begin() as conn:
        conn.execute(
            sa.text("UPDATE sluice.partition_rebuilds SET status = 'ABANDONED' WHERE id = :id"),
            {"id": rebuild},
        )
    swept = remove_orphans(uri, None, engine, timedelta(hours=1))
    assert (swept.orphans_removed, swept.pending_kept) == (2, 0)
    assert not unpublished.exists() and not rebuilt.exists()
    assert_same_rows(delta_rows(uri)[0], oracle)
