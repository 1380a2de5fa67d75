"""The Iceberg sink end to end: real Postgres (Sluice's catalog in it), real local Spark,
real PyIceberg; the table read back by PyIceberg's scan and by DuckDB over the current
snapshot's data files, compared with an oracle computed from the landing files."""

from __future__ import annotations

import dataclasses
import shutil
from collections.abc import Iterator
from datetime import date
from typing import Any

import pyarrow.parquet as pq
import pyiceberg.catalog
import pytest
import sqlalchemy as sa
from conftest import TestSettings as Settings
from demo_platform import demo_discover, prepare_demo
from iceberg_tables import (
    assert_exact,
    checkpoints,
    current_files,
    files_of_day,
    iceberg_pipeline,
    load,
    oracle,
    table_name,
)
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.exceptions import NoSuchTableError
from pyiceberg.utils.config import Config

from enumerator_service._operations import Platform, open_platform
from enumerator_service._rebuilds import RebuildStore
from enumerator_service._schema import partition_rebuilds
from spark_jobs.connectors import sink_connector_named
from spark_jobs.connectors.iceberg._commit import REBUILD_ID
from spark_jobs.jobs import run_pipeline

pytestmark = pytest.mark.spark

DAY = date(2026, 1, 1)
OTHER_DAY = date(2026, 1, 2)


@pytest.fixture
def platform(make_settings: Any) -> Iterator[tuple[Settings, Platform]]:
    settings: Settings = make_settings()
    platform = open_platform(settings)
    prepare_demo(settings, platform)
    demo_discover(platform)
    yield settings, platform
    platform.close()


def test_a_run_commits_one_snapshot_per_checkpoint_exactly_once(
    platform: tuple[Settings, Platform],
) -> None:
    settings, plat = platform
    summary = run_pipeline(settings, iceberg_pipeline(settings))
    table = load(plat.engine, settings)
    assert_exact(table, oracle(settings))
    found = checkpoints(table)
    assert found and len(found) == len(set(found))  # each checkpoint id at most once
    assert {run_id for run_id, _ in found} == {summary.run_id}
    assert [s.summary.operation.value for s in table.snapshots()] == ["append"] * len(found)
    assert [str(f.transform) for f in table.spec().fields] == ["day"]
    # Every data file carries the table's field ids.
    schema = table.schema()
    for path in current_files(table):
        for field in pq.read_schema(path.removeprefix("file://")):
            expected = str(schema.find_field(field.name).field_id).encode()
            assert field.metadata[b"PARQUET:field_id"] == expected


def test_an_incremental_run_adds_only_the_new_day(
    platform: tuple[Settings, Platform], tmp_path: Any
) -> None:
    settings, plat = platform
    pipeline = iceberg_pipeline(settings)
    # The first run sees only the first day's files.
    later = tmp_path / "later"
    shutil.move(settings.landing_path / f"dt={OTHER_DAY}", later)
    first = run_pipeline(settings, pipeline)
    table = load(plat.engine, settings)
    assert_exact(table, oracle(settings))
    day_files = files_of_day(table, DAY)
    # The second day lands; the next run adds it and nothing else.
    shutil.move(later, settings.landing_path / f"dt={OTHER_DAY}")
    demo_discover(plat)
    second = run_pipeline(settings, pipeline)
    table = load(plat.engine, settings)
    assert_exact(table, oracle(settings))
    assert files_of_day(table, DAY) == day_files
    runs = [run for run, _ in checkpoints(table)]
    assert set(runs) == {first.run_id, second.run_id}
    assert len(checkpoints(table)) == len(set(checkpoints(table)))


def test_rebuild_of_a_day_is_one_overwrite_and_leaves_other_days_alone(
    platform: tuple[Settings, Platform],
) -> None:
    settings, plat = platform
    pipeline = iceberg_pipeline(settings)
    run_pipeline(settings, pipeline)
    table = load(plat.engine, settings)
    other, replaced = files_of_day(table, OTHER_DAY), files_of_day(table, DAY)
    before = len(table.snapshots())

    summary = run_pipeline(settings, pipeline, dates=[DAY], rebuild=True)

    assert summary.rebuilt == (DAY.isoformat(),)
    table = load(plat.engine, settings)
    new = table.snapshots()[before:]
    assert [s.summary.operation.value for s in new] == ["overwrite"]
    assert new[0].summary.get(REBUILD_ID) is not None
    assert_exact(table, oracle(settings))
    assert files_of_day(table, OTHER_DAY) == other
    assert replaced and not files_of_day(table, DAY) & replaced  # the day is new files
    # The Dagster checks' accounting: committed rows of each day's current generation equal
    # the rows in the table's current snapshot, and the oracle's; no key twice.
    connector = sink_connector_named("iceberg")
    days = [DAY, OTHER_DAY]
    with plat.engine.connect() as conn:
        committed = connector.committed_rows(conn, pipeline, settings, days)
        present = connector.rows_out(conn, pipeline, settings, days)
    wanted = {day: sum(oracle(settings, {day}).values()) for day in days}
    assert committed == present == wanted
    for day in days:
        assert connector.duplicate_keys(pipeline, settings, day, ["event_id"]) == (0, [])
    assert "enriched" in connector.location(pipeline, settings, days)


def test_a_crash_after_the_rebuild_overwrite_does_not_overwrite_twice(
    platform: tuple[Settings, Platform], monkeypatch: pytest.MonkeyPatch
) -> None:
    settings, plat = platform
    pipeline = iceberg_pipeline(settings)
    run_pipeline(settings, pipeline)
    other = files_of_day(load(plat.engine, settings), OTHER_DAY)
    real_end_swap, crashed = RebuildStore.end_swap, []

    def end_swap(self: RebuildStore, rebuild: Any) -> None:
        if not crashed:
            crashed.append(rebuild.id)
            raise RuntimeError("injected: crash after the overwrite, before DONE")
        real_end_swap(self, rebuild)

    monkeypatch.setattr(RebuildStore, "end_swap", end_swap)
    with pytest.raises(Exception, match="injected"):
        run_pipeline(settings, pipeline, dates=[DAY], rebuild=True)
    assert crashed
    # The next run's recovery finishes the rebuild: DONE, without a second overwrite.
    run_pipeline(settings, pipeline)
    table = load(plat.engine, settings)
    rebuilds = [s.summary.get(REBUILD_ID) for s in table.snapshots()]
    assert [r for r in rebuilds if r is not None] == [str(crashed[0])]
    with plat.engine.connect() as conn:
        status = conn.execute(
            sa.select(partition_rebuilds.c.status).where(partition_rebuilds.c.id == crashed[0])
        ).scalar_one()
    assert status == "DONE"
    assert_exact(table, oracle(settings))
    assert files_of_day(table, OTHER_DAY) == other


def test_a_dagster_backfill_and_its_checks_read_the_iceberg_table(
    platform: tuple[Settings, Platform],
) -> None:
    from dagster import DagsterInstance, materialize
    from sluice_resource import resource_for

    from dagster_project import pipeline_definitions
    from dagster_project._counts import partition_counts

    settings, plat = platform
    pipeline = iceberg_pipeline(settings)
    source = dataclasses.replace(pipeline.source, start_date=settings.demo_start_date)
    built = pipeline_definitions(dataclasses.replace(pipeline, source=source), settings)
    with DagsterInstance.ephemeral() as instance:
        result = materialize(
            [built.output, *built.checks],
            tags={
                "dagster/asset_partition_range_start": DAY.isoformat(),
                "dagster/asset_partition_range_end": OTHER_DAY.isoformat(),
            },
            resources={"sluice": resource_for(settings)},
            instance=instance,
        )
    assert result.success
    checks = result.get_asset_check_evaluations()
    assert len(checks) == 2 * len(built.checks) and all(check.passed for check in checks)
    materialized = result.asset_materializations_for_node(pipeline.name)
    metadata = {key: value.value for key, value in materialized[0].metadata.items()}
    assert metadata["rows_out"] == sum(oracle(settings).values())
    assert str(metadata["output"]).startswith(f"iceberg sluice.{settings.source_name}.enriched")
    # The table as the run left it: its name and URI (Dagster's catalog keys), the snapshot,
    # and what this run's checkpoints added.
    table = load(plat.engine, settings)
    assert metadata["dagster/table_name"] == f"sluice.{settings.source_name}.enriched"
    assert metadata["dagster/uri"] == table.location()
    assert metadata["snapshot_id"] == table.current_snapshot().snapshot_id
    assert metadata["rows_added"] == metadata["rows_out"]
    assert metadata["files_added"] == len(current_files(table)) > 0
    counts = {c.day: c for c in partition_counts(pipeline, settings, [DAY, OTHER_DAY])}
    for day in (DAY, OTHER_DAY):
        assert counts[day].reconciles, counts[day]
        assert counts[day].rows_out == sum(oracle(settings, {day}).values())
    assert_exact(load(plat.engine, settings), oracle(settings))


def test_a_catalog_named_the_pyiceberg_way_gets_the_table(
    platform: tuple[Settings, Platform], tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``catalog="other"``: a catalog of the user's, configured by PyIceberg's own
    environment variables (here a SQL catalog in a SQLite file, another database than
    Sluice's): the table is created and committed there, exactly once, and Sluice's own
    catalog does not get it."""
    settings, plat = platform
    uri, warehouse = f"sqlite:///{tmp_path}/catalog.db", f"file://{tmp_path}/warehouse"
    monkeypatch.setenv("PYICEBERG_CATALOG__OTHER__TYPE", "sql")
    monkeypatch.setenv("PYICEBERG_CATALOG__OTHER__URI", uri)
    monkeypatch.setenv("PYICEBERG_CATALOG__OTHER__WAREHOUSE", warehouse)
    monkeypatch.setattr(pyiceberg.catalog, "_ENV_CONFIG", Config())  # (read at import)
    summary = run_pipeline(settings, iceberg_pipeline(settings, catalog="other"))
    catalog = SqlCatalog("other", uri=uri, warehouse=warehouse)  # a reader of its own
    table = catalog.load_table(table_name(settings))
    assert table.location().startswith(warehouse)
    assert_exact(table, oracle(settings))
    assert {run_id for run_id, _ in checkpoints(table)} == {summary.run_id}
    with pytest.raises(NoSuchTableError):
        load(plat.engine, settings)
