"""Maintenance of a table the Delta sink wrote (real Spark run of the clickstream demo, real
delta-rs): ``DeltaMaintenance`` bound the way the sink names its table (``table_uri``, the
key its committers lock) compacts both days, vacuums and sweeps, and the table still holds
exactly the landing oracle's events (delta-rs and Polars over the current files); the sink's
real staged entries are recognised as pending while their transaction is not published.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from datetime import date, timedelta
from pathlib import Path
from typing import Any

import polars as pl
import pytest
import sqlalchemy as sa
from conftest import TestSettings as Settings
from deltalake import DeltaTable
from demo_platform import demo_discover, demo_pipeline, prepare_demo
from landing_oracle import expected_events

from enumerator_service import open_location
from enumerator_service._operations import open_platform
from enumerator_service._schema import sink_transactions
from spark_jobs import DeltaSink
from spark_jobs.connectors import pending_files, sink_connector
from spark_jobs.connectors.delta import DeltaMaintenance
from spark_jobs.connectors.delta._paths import delta_storage, table_uri
from spark_jobs.jobs import run_pipeline

# `make faults` only: the Iceberg sink's twin stays in `make test` (CI's time limit).
pytestmark = [pytest.mark.spark, pytest.mark.extended]


def _exact(table: Path, oracle: list[dict[str, Any]]) -> None:
    delta = DeltaTable(str(table))
    wanted = Counter(str(row["event_id"]) for row in oracle)
    for rows in (
        delta.to_pyarrow_table().to_pylist(),
        pl.read_parquet(delta.file_uris()).to_dicts(),
    ):
        got = Counter(str(row["event_id"]) for row in rows)
        assert sum((got - wanted).values()) == 0  # duplicates (or strangers)
        assert sum((wanted - got).values()) == 0  # missing


def test_maintenance_of_a_table_the_delta_sink_wrote(make_settings: Any, tmp_path: Path) -> None:
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
    table = tmp_path / "lake" / "events"
    pipeline = dataclasses.replace(demo_pipeline(settings), sink=DeltaSink(str(table)))
    demo_discover(platform)
    run_pipeline(settings, pipeline, run_id=f"{settings.source_name}-m1")
    for n, path in enumerate(later):
        (aside / str(n) / path.name).rename(path)
    demo_discover(platform)
    run_pipeline(settings, pipeline, run_id=f"{settings.source_name}-m2")
    oracle, _bad = expected_events(landing)
    _exact(table, oracle)
    location = open_location(str(table))
    maintenance = DeltaMaintenance(table_uri(location), delta_storage(location), platform.engine)
    days = sorted({date.fromisoformat(str(row["dt"])) for row in oracle})
    try:
        results = [maintenance.compact_day(day) for day in days]
        for day, done in zip(days, results, strict=True):
            assert (done.skipped, done.files_after) == (False, 1) and done.files_before >= 2
            assert done.rows == sum(1 for row in oracle if str(row["dt"]) == day.isoformat())
        _exact(table, oracle)
        # The Dagster row checks still reconcile: the table's rows = the platform's commits.
        connector = sink_connector(pipeline.sink)
        assert connector is not None
        with platform.engine.connect() as conn:
            committed = connector.committed_rows(conn, pipeline, settings, days)
            present = connector.rows_out(conn, pipeline, settings, days)
        assert committed == present == {d: done.rows for d, done in zip(days, results, strict=True)}
        assert maintenance.expire(timedelta(0)).current == DeltaTable(str(table)).version()
        swept = maintenance.remove_orphans(timedelta(0))
        assert swept.orphans_removed == 0  # the sink leaves no stray file behind
        _exact(table, oracle)

        # The sink's own staged entries, while their transaction waits for its publish.
        with platform.engine.begin() as conn:
            txn, staged = conn.execute(
                sa.select(sink_transactions.c.id, sink_transactions.c.staged)
                .where(
                    sink_transactions.c.run_id == f"{settings.source_name}-m2",
                    sink_transactions.c.committed,
                )
                .order_by(sink_transactions.c.id.desc())
                .limit(1)
            ).one()
            conn.execute(
                sa.update(sink_transactions)
                .where(sink_transactions.c.id == txn)
                .values(published=False)
            )
        pending = pending_files(platform.engine, location.path)
        assert pending and all(Path(p).is_relative_to(table) for p in pending), (pending, staged)
        with platform.engine.begin() as conn:
            conn.execute(
                sa.update(sink_transactions)
                .where(sink_transactions.c.id == txn)
                .values(published=True)
            )
    finally:
        platform.close()
