"""Maintenance of a table the Iceberg sink wrote (real Spark runs of the clickstream demo, the
SQL catalog on the test Postgres), bound by the connector itself
(``SinkConnector.maintenance``: the table partitioned by ``day(event_time)``, the lock its
committers hold): each day's small files compacted in one snapshot, a second compaction a
no-op, snapshots expired, no orphan left, and the table still exactly the landing oracle
(PyIceberg's scan and DuckDB); the Dagster row checks still reconcile."""

from __future__ import annotations

from datetime import date, timedelta
from pathlib import Path
from typing import Any

import pytest
from conftest import TestSettings as Settings
from demo_platform import demo_discover, prepare_demo
from iceberg_tables import assert_exact, files_of_day, iceberg_pipeline, load, oracle

from enumerator_service._operations import open_platform
from spark_jobs.connectors import sink_connector
from spark_jobs.connectors.iceberg import COMPACTION_PROPERTY, compact_day
from spark_jobs.jobs import run_pipeline

pytestmark = pytest.mark.spark


def table_data(table: Any) -> Path:
    return Path(table.location().removeprefix("file://")) / "data"


def test_the_iceberg_sinks_own_maintenance_compacts_expires_and_sweeps(
    make_settings: Any, tmp_path: Path
) -> None:
    settings: Settings = make_settings(demo_events=400, demo_days=2, demo_files_per_day=3)
    platform = open_platform(settings)
    prepare_demo(settings, platform)
    # Two runs, each over part of every day's landing files: each day gets files of both.
    landing = Path(settings.landing_path)
    later = [sorted(day.glob("*.jsonl"))[-1] for day in sorted(landing.glob("dt=*"))]
    aside = tmp_path / "aside"
    for n, path in enumerate(later):
        (aside / str(n)).mkdir(parents=True)
        path.rename(aside / str(n) / path.name)
    pipeline = iceberg_pipeline(settings)
    try:
        demo_discover(platform)
        run_pipeline(settings, pipeline, run_id=f"{settings.source_name}-m1")
        for n, path in enumerate(later):
            (aside / str(n) / path.name).rename(path)
        demo_discover(platform)
        run_pipeline(settings, pipeline, run_id=f"{settings.source_name}-m2")
        expected = oracle(settings)
        table = load(platform.engine, settings)
        assert_exact(table, expected)
        connector = sink_connector(pipeline.sink)
        assert connector is not None
        maintenance = connector.maintenance(platform.engine, pipeline, settings)
        assert maintenance is not None
        days = sorted(date.fromisoformat(p.name[3:]) for p in landing.glob("dt=*"))
        days = [d for d in days if files_of_day(table, d)]
        assert days
        before = {day: files_of_day(table, day) for day in days}
        assert all(len(files) >= 2 for files in before.values()), before

        results = [maintenance.compact_day(day) for day in days]
        table = load(platform.engine, settings)
        for day, done in zip(days, results, strict=True):
            assert not done.skipped and done.files_before == len(before[day])
            assert len(files_of_day(table, day)) == done.files_after < done.files_before
        compactions = [
            s.summary.get(COMPACTION_PROPERTY) for s in table.snapshots() if s.summary is not None
        ]
        assert sorted(c for c in compactions if c) == [d.isoformat() for d in days]
        assert_exact(table, expected)
        assert all(maintenance.compact_day(day).skipped for day in days)  # twice: nothing
        # Called directly, the day column is the one the table's spec partitions by day on.
        assert compact_day(table, platform.engine, days[0], lock=maintenance.table).skipped
        with platform.engine.connect() as conn:
            committed = connector.committed_rows(conn, pipeline, settings, days)
            present = connector.rows_out(conn, pipeline, settings, days)
        assert committed == present == {d: r.rows for d, r in zip(days, results, strict=True)}

        expired = maintenance.expire(timedelta(0))
        table = load(platform.engine, settings)
        assert (
            len(table.snapshots()) == 1 and expired.current == table.current_snapshot().snapshot_id
        )
        swept = maintenance.remove_orphans(timedelta(0))
        # Compaction replaced files the expired snapshots named: now orphans, swept.
        assert swept.orphans_removed == sum(len(files) for files in before.values())
        assert maintenance.remove_orphans(timedelta(0)).orphans_removed == 0
        assert (table_data(table) / "_sluice" / "field-ids.json").is_file()  # not data: kept
        assert_exact(load(platform.engine, settings), expected)
    finally:
        platform.close()
