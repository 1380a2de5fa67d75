"""The Iceberg sink's exactly-once under failure: a publish repeated, a crash before and
after the snapshot commit (then recovery), and another process appending to the same table
while a run commits. Real Postgres, Spark, PyIceberg; the table read back by two engines."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from conftest import TestSettings as Settings
from demo_platform import demo_discover, prepare_demo
from foreign_writer import BATCH, committed_ids, foreign_writer
from iceberg_tables import (
    assert_exact,
    checkpoints,
    iceberg_pipeline,
    load,
    oracle,
    table_name,
)
from sqlalchemy.engine import make_url

from enumerator_service import _checkpoint_store
from enumerator_service._checkpoint_recovery import _staged
from enumerator_service._operations import Platform, open_platform
from enumerator_service._schema import sink_transactions
from spark_jobs.connectors.iceberg import IcebergCommitter, _commit
from spark_jobs.connectors.iceberg._catalog import default_warehouse
from spark_jobs.connectors.iceberg._commit import RUN_ID
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


def test_another_process_appending_meanwhile_keeps_both_writers_rows_exactly_once(
    make_settings: Any, db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 24's acceptance: another OS process (PyIceberg's own SqlCatalog on the same
    Postgres, its own connection) appends to the table in a loop while a run commits
    checkpoint after checkpoint; one of its commits is forced between the run's first table
    load and commit, so that commit conflicts for sure. Both writers' rows end up in the
    table exactly once, and every checkpoint of the run is one snapshot."""
    # One subtask reading small blocks slowly (one lookup of 150 ms at a time) and frequent
    # checkpoints: the run commits many snapshots over seconds, the other process between.
    settings: Settings = make_settings(
        target_split_bytes=64 << 10,
        read_block_bytes=16 << 10,
        lookup_capacity=1,
        lookup_injected_latency_ms=150,
        parallelism=1,
        checkpoint_interval_seconds=0.2,
    )
    plat = open_platform(settings)
    try:
        prepare_demo(settings, plat)
        demo_discover(plat)
        pipeline = iceberg_pipeline(settings)
        uri = make_url(db_url).set(drivername="postgresql+psycopg")
        loaded: list[int] = []
        raced: list[dict[str, Any]] = []
        real_data_files = _commit.data_files
        with foreign_writer(
            tmp_path / "foreign",
            uri.render_as_string(hide_password=False),
            format="iceberg",
            table=table_name(settings),
            warehouse=default_warehouse(settings),
            # (0.25 s between its commits: a busy writer; the publish's jittered backoff
            # finds a gap between them)
            pause=0.25,
        ) as writer:

            def racing_data_files(table: Any, entries: Any) -> Any:
                # The run's first commit: the other process commits after this load.
                if not loaded:
                    loaded.append(table.current_snapshot().snapshot_id)
                    raced.append(writer.race())
                return real_data_files(table, entries)

            monkeypatch.setattr(_commit, "data_files", racing_data_files)
            summary = run_pipeline(settings, pipeline)
            commits = writer.stop()
        table = load(plat.engine, settings)
    finally:
        plat.close()
    # Both writers' rows exactly once (two engines), each checkpoint one snapshot.
    assert_exact(table, oracle(settings) + committed_ids(commits))
    assert len(checkpoints(table)) == len(set(checkpoints(table)))
    # The table's foreign snapshots are exactly the commits the process reports.
    snapshots = table.snapshots()
    foreign = {
        int(s.summary.get(BATCH)): s.snapshot_id
        for s in snapshots
        if s.summary is not None and s.summary.get(BATCH) is not None
    }
    assert foreign == {c["batch"]: c["commit"] for c in commits}
    # The forced race: the run's first snapshot is not on the snapshot its commit loaded
    # (its commit failed and was retried on the newer table), the raced one came before.
    ours = [s for s in snapshots if s.summary and s.summary.get(RUN_ID) == summary.run_id]
    order = [s.snapshot_id for s in snapshots]
    assert ours[0].parent_snapshot_id != loaded[0]
    assert order.index(raced[0]["commit"]) < order.index(ours[0].snapshot_id)
    # The other process committed during the run, between the run's first and last snapshot.
    during = [c for c in commits if ours[0].timestamp_ms < c["at_ms"] < ours[-1].timestamp_ms]
    assert len(during) >= 2, (len(ours), len(commits), len(during))
