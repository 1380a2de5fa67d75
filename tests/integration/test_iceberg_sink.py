"""The Iceberg sink end to end: real Postgres (Sluice's catalog in it), real local Spark,
real PyIceberg; the table read back by PyIceberg's scan and by DuckDB over the current
snapshot's data files, compared with an oracle computed from the landing files."""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Iterator
from datetime import date
from typing import Any

import duckdb
import pytest
from conftest import TestSettings as Settings
from demo_platform import demo_discover, demo_pipeline, prepare_demo
from landing_oracle import expected_events

from enumerator_service._operations import Platform, open_platform
from spark_jobs import IcebergSink, Pipeline
from spark_jobs.connectors.iceberg._catalog import open_catalog
from spark_jobs.connectors.iceberg._commit import CHECKPOINT_ID, REBUILD_ID, RUN_ID
from spark_jobs.jobs import RunSummary, run_pipeline

pytestmark = pytest.mark.spark

DAY = date(2026, 1, 1)
OTHER_DAY = date(2026, 1, 2)


def iceberg_pipeline(settings: Settings, **sink: Any) -> Pipeline:
    table = sink.pop("table", f"sluice_test.{settings.source_name}")
    return dataclasses.replace(demo_pipeline(settings), sink=IcebergSink(table, **sink))


@pytest.fixture
def platform(make_settings: Any) -> Iterator[tuple[Settings, Platform]]:
    settings: Settings = make_settings()
    platform = open_platform(settings)
    prepare_demo(settings, platform)
    demo_discover(platform)
    yield settings, platform
    platform.close()


def load(platform: Platform, settings: Settings) -> Any:
    catalog = open_catalog(platform.engine, None, None)
    return catalog.load_table(f"sluice_test.{settings.source_name}")


def current_files(table: Any) -> list[str]:
    return sorted(t.file.file_path for t in table.scan().plan_files())


def event_ids_duckdb(table: Any) -> Counter[str]:
    paths = [p.removeprefix("file://") for p in current_files(table)]
    if not paths:
        return Counter()
    rows = duckdb.sql(f"SELECT event_id FROM read_parquet({paths!r})").fetchall()
    return Counter(r[0] for r in rows)


def oracle(settings: Settings, days: set[date] | None = None) -> Counter[str]:
    events, _ = expected_events(settings.landing_path)
    return Counter(e["event_id"] for e in events if days is None or e["event_time"].date() in days)


def assert_exact(table: Any, expected: Counter[str]) -> None:
    scanned = Counter(table.scan(selected_fields=("event_id",)).to_arrow().column(0).to_pylist())
    for got in (scanned, event_ids_duckdb(table)):
        duplicates = sum(n - 1 for n in got.values() if n > 1)
        missing = sum((expected - got).values())
        extra = sum((got - expected).values())
        assert (duplicates, missing, extra) == (0, 0, 0)


def checkpoints(table: Any) -> list[tuple[str, str]]:
    found = []
    for snap in table.snapshots():
        summary = snap.summary
        if summary.get(CHECKPOINT_ID) is not None:
            found.append((summary[RUN_ID], summary[CHECKPOINT_ID]))
    return found


def run(settings: Settings, pipeline: Pipeline, **options: Any) -> RunSummary:
    return run_pipeline(settings, pipeline, **options)


def test_a_run_commits_one_snapshot_per_checkpoint_exactly_once(
    platform: tuple[Settings, Platform],
) -> None:
    settings, plat = platform
    summary = run(settings, iceberg_pipeline(settings))
    table = load(plat, settings)
    assert_exact(table, oracle(settings))
    found = checkpoints(table)
    assert found and len(found) == len(set(found))  # each checkpoint id at most once
    assert {run_id for run_id, _ in found} == {summary.run_id}
    assert [f.transform.__class__.__name__ for f in table.spec().fields] == ["DayTransform"]
    field_id = table.schema().find_field("event_id").field_id
    import pyarrow.parquet as pq

    first = current_files(table)[0].removeprefix("file://")
    arrow_field = pq.read_schema(first).field("event_id")
    assert arrow_field.metadata[b"PARQUET:field_id"] == str(field_id).encode()


def test_rebuild_of_a_day_is_one_overwrite_and_leaves_other_days_alone(
    platform: tuple[Settings, Platform],
) -> None:
    settings, plat = platform
    pipeline = iceberg_pipeline(settings)
    run(settings, pipeline)
    table = load(plat, settings)
    ordinal = (OTHER_DAY - date(1970, 1, 1)).days
    other = {t.file.file_path for t in table.scan().plan_files() if t.file.partition[0] == ordinal}
    before = len(table.snapshots())

    summary = run(settings, pipeline, dates=[DAY], rebuild=True)

    assert summary.rebuilt == (DAY.isoformat(),)
    table = load(plat, settings)
    new = table.snapshots()[before:]
    assert [s.summary.operation.value for s in new] == ["overwrite"]
    assert new[0].summary.get(REBUILD_ID) is not None
    assert_exact(table, oracle(settings))
    after = {t.file.file_path for t in table.scan().plan_files() if t.file.partition[0] == ordinal}
    assert after == other
