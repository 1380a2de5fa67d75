"""The Iceberg sink with the warehouse on S3 (a real S3-protocol server: moto on 127.0.0.1,
``tests/s3_server.py``): data files staged straight under the table's S3 data prefix, one
snapshot per checkpoint, a day rebuilt in one overwrite — read back by PyIceberg's scan and
by DuckDB over the current snapshot's data files (fetched through pyarrow's S3 client)."""

from __future__ import annotations

import secrets
from collections import Counter
from collections.abc import Iterator
from datetime import date
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest
from conftest import TestSettings as Settings
from demo_platform import demo_discover, prepare_demo
from iceberg_tables import (
    checkpoints,
    differences,
    files_of_day,
    iceberg_pipeline,
    landing_revenue,
    load,
    oracle,
    scan_ids,
)
from s3_server import S3Server, s3_server, set_standard_chain

from enumerator_service import StorageOptions, open_location
from enumerator_service._operations import Platform, open_platform
from examples.clickstream_revenue import REVENUE_TABLE, build_daily_revenue
from spark_jobs.jobs import run_pipeline

# `make faults` only (as the Delta sink's S3 test): `make test` is at CI's time limit.
pytestmark = [pytest.mark.spark, pytest.mark.extended]

DAY, OTHER_DAY = date(2026, 1, 1), date(2026, 1, 2)

set_standard_chain()  # the fake credentials in os.environ before any Spark session starts


@pytest.fixture(scope="module")
def s3() -> Iterator[S3Server]:
    with s3_server() as server:
        yield server


@pytest.fixture
def on_s3(s3: S3Server, make_settings: Any) -> Iterator[tuple[Settings, Platform]]:
    bucket = f"sluice-{secrets.token_hex(4)}"
    s3.create_bucket(bucket)
    settings: Settings = make_settings(warehouse_dir=f"s3://{bucket}/warehouse")
    platform = open_platform(settings)
    prepare_demo(settings, platform)
    demo_discover(platform)
    yield settings, platform
    platform.close()


def duckdb_ids_on_s3(table: Any, storage: StorageOptions) -> Counter[str]:
    """event_id counts by DuckDB over the current snapshot's data files (from S3)."""
    parts = []
    for task in table.scan().plan_files():
        where = open_location(task.file.file_path, storage)
        parts.append(pq.read_table(where.path, filesystem=where.fs, columns=["event_id"]))
    events = pa.concat_tables(parts)  # noqa: F841 (DuckDB reads it by name)
    return Counter(r[0] for r in duckdb.sql("SELECT event_id FROM events").fetchall())


def test_a_run_and_a_rebuild_with_the_warehouse_on_s3(on_s3: tuple[Settings, Platform]) -> None:
    settings, plat = on_s3
    storage = StorageOptions.of(settings)
    pipeline = iceberg_pipeline(settings)
    run_pipeline(settings, pipeline)
    table = load(plat.engine, settings, storage)
    assert table.location().startswith(f"{settings.warehouse_uri}/iceberg/")
    assert differences(scan_ids(table), oracle(settings)) == (0, 0, 0)
    assert differences(duckdb_ids_on_s3(table, storage), oracle(settings)) == (0, 0, 0)
    assert checkpoints(table) and len(checkpoints(table)) == len(set(checkpoints(table)))
    other, before = files_of_day(table, OTHER_DAY), len(table.snapshots())

    run_pipeline(settings, pipeline, dates=[DAY], rebuild=True)

    table = load(plat.engine, settings, storage)
    assert [s.summary.operation.value for s in table.snapshots()[before:]] == ["overwrite"]
    assert files_of_day(table, OTHER_DAY) == other
    assert differences(scan_ids(table), oracle(settings)) == (0, 0, 0)
    assert differences(duckdb_ids_on_s3(table, storage), oracle(settings)) == (0, 0, 0)


def test_the_revenue_example_reads_the_table_on_s3_by_snapshot(
    on_s3: tuple[Settings, Platform],
) -> None:
    """The downstream example asset's work (``build_daily_revenue``) on a table whose
    warehouse is on S3: it reads the day by the current snapshot and writes its one object
    under the warehouse on S3, equal to the landing oracle."""
    settings, plat = on_s3
    pipeline = iceberg_pipeline(settings)
    run_pipeline(settings, pipeline)
    snapshot = load(plat.engine, settings, StorageOptions.of(settings)).current_snapshot()
    assert snapshot is not None
    built = build_daily_revenue(settings, [DAY], pipeline)
    assert built.snapshot_id == snapshot.snapshot_id
    where = open_location(
        f"{settings.warehouse_uri}/{REVENUE_TABLE}/dt={DAY.isoformat()}",
        StorageOptions.of(settings),
    )
    (found,) = where.fs.get_file_info(pafs.FileSelector(where.path))
    written = pq.read_table(found.path, filesystem=where.fs).to_pylist()
    expected = landing_revenue(settings, DAY)
    assert {r["user_country"] for r in written} == set(expected)
    for row in written:
        revenue, orders, events = expected[row["user_country"]]
        assert row["revenue"] == pytest.approx(revenue)
        assert (row["orders"], row["events"]) == (orders, events)
