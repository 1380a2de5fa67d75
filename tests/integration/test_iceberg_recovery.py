"""The Iceberg sink's exactly-once under failure: a publish repeated, a crash before and
after the snapshot commit (then recovery), and another writer appending to the same table
while a run commits. Real Postgres, Spark, PyIceberg; the table read back by two engines."""

from __future__ import annotations

import os
import threading
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import sqlalchemy as sa
from conftest import TestSettings as Settings
from demo_platform import demo_discover, prepare_demo
from iceberg_tables import assert_exact, checkpoints, iceberg_pipeline, load, oracle
from pyiceberg.exceptions import CommitFailedException
from pyiceberg.io.pyarrow import parquet_file_to_data_file, schema_to_pyarrow

from enumerator_service import _checkpoint_store
from enumerator_service._checkpoint_recovery import _staged
from enumerator_service._operations import Platform, open_platform
from enumerator_service._schema import sink_transactions
from spark_jobs.connectors.iceberg import IcebergCommitter, _commit
from spark_jobs.jobs import run_pipeline

pytestmark = pytest.mark.spark


@pytest.fixture
def platform(make_settings: Any) -> Iterator[tuple[Settings, Platform]]:
    settings: Settings = make_settings()
    platform = open_platform(settings)
    prepare_demo(settings, platform)
    demo_discover(platform)
    yield settings, platform
    platform.close()


def committed_transactions(platform: Platform, run_id: str) -> list[Any]:
    with platform.engine.connect() as conn:
        rows = conn.execute(
            sa.select(sink_transactions)
            .where(sink_transactions.c.run_id == run_id, sink_transactions.c.committed)
            .order_by(sink_transactions.c.id)
        ).all()
    return _staged(rows)


def test_publishing_the_same_transactions_again_commits_nothing(
    platform: tuple[Settings, Platform],
) -> None:
    settings, plat = platform
    summary = run_pipeline(settings, iceberg_pipeline(settings))
    snapshots = [s.snapshot_id for s in load(plat.engine, settings).snapshots()]
    txns = committed_transactions(plat, summary.run_id)
    assert txns and snapshots
    committer = IcebergCommitter(plat.engine)
    committer.publish(txns)  # as a recovery would: every committed transaction at once
    for txn in txns:  # and one by one, as the coordinator publishes each completion
        committer.publish([txn])
    table = load(plat.engine, settings)
    assert [s.snapshot_id for s in table.snapshots()] == snapshots
    assert_exact(table, oracle(settings))


@pytest.mark.parametrize("where", ["before_snapshot", "after_snapshot"])
def test_a_crash_around_the_snapshot_commit_is_recovered_exactly(
    platform: tuple[Settings, Platform], monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    """The first publish dies before its snapshot is committed (the data files are written
    and committed in Postgres), or after it (before Postgres records it published); the run
    fails, and the next run's recovery publishes what is left — exactly once."""
    settings, plat = platform
    fired = threading.Event()
    if where == "before_snapshot":
        original = IcebergCommitter.publish

        def publish(self: IcebergCommitter, txns: Any) -> None:
            if not fired.is_set() and any(t.row_count for t in txns):
                fired.set()
                raise RuntimeError("injected: crash before the snapshot commit")
            original(self, txns)

        monkeypatch.setattr(IcebergCommitter, "publish", publish)
    else:
        mark = _checkpoint_store._mark_published

        def mark_published(engine: Any, txns: Any) -> None:
            # (after a publish that committed a snapshot: a checkpoint without rows has none)
            if not fired.is_set() and any(t.row_count for t in txns):
                fired.set()
                raise RuntimeError("injected: crash after the snapshot commit")
            mark(engine, txns)

        monkeypatch.setattr(_checkpoint_store, "_mark_published", mark_published)
    pipeline = iceberg_pipeline(settings)
    with pytest.raises(Exception, match="injected"):
        run_pipeline(settings, pipeline)
    assert fired.is_set()
    table = load(plat.engine, settings)
    before = len(checkpoints(table))
    assert before == (0 if where == "before_snapshot" else 1)

    run_pipeline(settings, pipeline)  # recovery publishes, then the rest is processed

    table = load(plat.engine, settings)
    assert_exact(table, oracle(settings))
    assert len(checkpoints(table)) == len(set(checkpoints(table)))


def race_once(table: Any, appended: Counter[str]) -> None:
    """One commit of another writer, now (its rows counted in ``appended``)."""
    rows = foreign_rows(schema_to_pyarrow(table.schema()), -1, 3)
    path = f"{table.location().removeprefix('file://')}/data/foreign/race.parquet"
    os.makedirs(os.path.dirname(path), exist_ok=True)
    pq.write_table(rows, path)
    with table.transaction() as tx, tx.update_snapshot().fast_append() as append:
        append.append_data_file(
            parquet_file_to_data_file(table.io, table.metadata, f"file://{path}")
        )
    appended.update(rows.column("event_id").to_pylist())


def foreign_rows(schema: pa.Schema, batch: int, n: int) -> pa.Table:
    """Rows of another writer (ids no landing file has), on the first demo day."""
    at = datetime(2026, 1, 1, 12, tzinfo=UTC)
    columns: dict[str, Any] = {f.name: pa.nulls(n, f.type) for f in schema}
    columns["event_id"] = pa.array(
        [f"foreign-{batch}-{i}" for i in range(n)], schema.field("event_id").type
    )
    columns["event_time"] = pa.array([at] * n, schema.field("event_time").type)
    return pa.table(columns, schema=schema)


def test_another_writer_appending_meanwhile_keeps_both_writers_rows_exactly_once(
    platform: tuple[Settings, Platform], monkeypatch: pytest.MonkeyPatch
) -> None:
    settings, plat = platform
    pipeline = iceberg_pipeline(settings)
    # The table exists before the run (its first run created it with one day missing).
    run_pipeline(settings, pipeline, dates=[datetime(2026, 1, 1).date()])
    stop, appended, conflicts = threading.Event(), Counter[str](), [0]

    def other_writer() -> None:
        # Another engine's commits: a data file of its own, appended with its own retry.
        batch = 0
        while not stop.is_set() or batch < 3:
            table = load(plat.engine, settings)
            rows = foreign_rows(schema_to_pyarrow(table.schema()), batch, 5)
            path = f"{table.location().removeprefix('file://')}/data/foreign/{batch}.parquet"
            os.makedirs(os.path.dirname(path), exist_ok=True)
            pq.write_table(rows, path)
            try:
                with table.transaction() as tx, tx.update_snapshot().fast_append() as append:
                    append.append_data_file(
                        parquet_file_to_data_file(table.io, table.metadata, f"file://{path}")
                    )
            except CommitFailedException:
                conflicts[0] += 1
                continue  # its own retry: reload, append again
            appended.update(rows.column("event_id").to_pylist())
            batch += 1

    # At least one conflict for sure: the first commit of the run finds that the other
    # writer committed between its table load and its commit.
    real_data_files, raced = _commit.data_files, threading.Event()

    def racing_data_files(table: Any, entries: Any) -> Any:
        if not raced.is_set():
            raced.set()
            race_once(load(plat.engine, settings), appended)
        return real_data_files(table, entries)

    monkeypatch.setattr(_commit, "data_files", racing_data_files)
    thread = threading.Thread(target=other_writer, name="foreign-writer")
    thread.start()
    try:
        run_pipeline(settings, pipeline)
    finally:
        stop.set()
        thread.join(timeout=60)
    table = load(plat.engine, settings)
    assert raced.is_set() and appended
    assert_exact(table, oracle(settings) + appended)
    assert len(checkpoints(table)) == len(set(checkpoints(table)))
