"""The Iceberg sink with a pipeline defined here (CSV files → IcebergSink with an upsert
key, unpartitioned) and the bad definitions and settings it refuses before a run starts,
each in one line naming the sink option or the setting (and never the catalog's password).
Real Postgres, Spark and PyIceberg; tables read back with PyIceberg and DuckDB."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pyiceberg.catalog
import pytest
from conftest import TestSettings as Settings
from demo_platform import demo_discover, demo_pipeline, prepare_demo
from iceberg_tables import iceberg_pipeline, table_name
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.transforms import DayTransform
from pyiceberg.utils.config import Config

from enumerator_service import ConfigError
from enumerator_service._operations import Platform, discover, open_platform
from spark_jobs import FileSource, IcebergSink, Pipeline
from spark_jobs.connectors.iceberg._catalog import default_warehouse, ensure_namespace, open_catalog
from spark_jobs.connectors.iceberg._commit import data_files
from spark_jobs.connectors.iceberg._table import iceberg_schema, with_field_ids
from spark_jobs.jobs import run_pipeline
from spark_jobs.pipeline import PipelineDefinitionError
from spark_jobs.pipeline._paths import discovery_of

pytestmark = pytest.mark.spark


@pytest.fixture
def platform(make_settings: Any) -> Iterator[tuple[Settings, Platform]]:
    settings: Settings = make_settings()
    platform = open_platform(settings)
    yield settings, platform
    platform.close()


def write_csv(folder: Path, name: str, rows: list[tuple[int, str, int]]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    lines = ["id,name,version", *(f"{i},{n},{v}" for i, n, v in rows)]
    (folder / name).write_text("\n".join(lines) + "\n")


def test_an_upsert_pipeline_keeps_the_latest_row_per_key(
    platform: tuple[Settings, Platform], tmp_path: Path
) -> None:
    settings, plat = platform
    landing = tmp_path / "landing"
    pipeline = Pipeline(
        name=settings.source_name,
        source=FileSource(
            schema={"id": "int64", "name": "string", "version": "int64"},
            required=["id", "version"],
            partition_by=None,
            landing=landing,
        ),
        sink=IcebergSink(f"{settings.source_name}.items", upsert_key=["id"]),
    )
    write_csv(landing, "a.csv", [(i, f"n{i}", 1) for i in range(1, 51)])
    discover(plat, discovery_of(pipeline, settings))
    run_pipeline(settings, pipeline)
    # Keys 40..60 again, 60 twice in the same file: the later row wins.
    write_csv(landing, "b.csv", [*((i, f"m{i}", 2) for i in range(40, 61)), (60, "last", 3)])
    discover(plat, discovery_of(pipeline, settings))
    run_pipeline(settings, pipeline)

    table = open_catalog(plat.engine, None, None).load_table(f"{settings.source_name}.items")
    expected = {i: (f"n{i}", 1) for i in range(1, 40)}
    expected |= {i: (f"m{i}", 2) for i in range(40, 60)} | {60: ("last", 3)}
    scanned = table.scan().to_arrow().to_pylist()
    assert len(scanned) == len(expected)  # no key twice
    assert {r["id"]: (r["name"], r["version"]) for r in scanned} == expected
    paths = [t.file.file_path.removeprefix("file://") for t in table.scan().plan_files()]
    rows = duckdb.sql(f"SELECT id, name, version FROM read_parquet({paths!r})").fetchall()
    assert len(rows) == len(expected) and {r[0]: (r[1], r[2]) for r in rows} == expected
    upserts = [s for s in table.snapshots() if s.summary.get("sluice.checkpoint-id")]
    assert upserts[-1].summary.operation.value == "overwrite"  # one snapshot: delete + add


def test_a_field_the_pipeline_adds_becomes_a_column(
    platform: tuple[Settings, Platform], tmp_path: Path
) -> None:
    settings, plat = platform
    landing = tmp_path / "landing"
    source = FileSource(
        schema={"id": "int64", "name": "string"},
        required=["id"],
        partition_by=None,
        landing=landing,
    )
    first = Pipeline(
        name=settings.source_name,
        source=source,
        sink=IcebergSink(f"{settings.source_name}.items"),
    )
    write_csv(landing, "a.csv", [(i, f"n{i}", 1) for i in range(5)])
    discover(plat, discovery_of(first, settings))
    run_pipeline(settings, first)
    wider = dataclasses.replace(
        first,
        source=dataclasses.replace(source, schema={**source.schema, "version": "int64"}),
    )
    write_csv(landing, "b.csv", [(i, f"m{i}", 2) for i in range(5, 8)])
    discover(plat, discovery_of(wider, settings))
    run_pipeline(settings, wider)
    table = open_catalog(plat.engine, None, None).load_table(f"{settings.source_name}.items")
    assert [f.name for f in table.schema().fields] == ["id", "name", "version"]
    rows = {r["id"]: r["version"] for r in table.scan().to_arrow().to_pylist()}
    assert rows == {**dict.fromkeys(range(5)), **dict.fromkeys(range(5, 8), 2)}


def refusal(settings: Settings, pipeline: Pipeline) -> str:
    with pytest.raises(ConfigError) as caught:
        run_pipeline(settings, pipeline)
    line = str(caught.value)
    assert "\n" not in line
    return line


@pytest.fixture
def demo(platform: tuple[Settings, Platform]) -> tuple[Settings, Platform]:
    settings, plat = platform
    prepare_demo(settings, plat)
    demo_discover(plat)
    return settings, plat


def test_partitions_that_cannot_be_a_day_spec_are_refused_when_defined(
    demo: tuple[Settings, Platform],
) -> None:
    """Caught when the pipeline is defined (``sluice pipelines``, the code location), before
    any catalog is opened: one line naming the sink option."""
    settings, _ = demo

    def refused(**changes: Any) -> str:
        base = demo_pipeline(settings)
        sink = IcebergSink(table_name(settings), **changes.pop("sink", {}))
        source = dataclasses.replace(base.source, **changes)
        with pytest.raises(PipelineDefinitionError) as caught:
            dataclasses.replace(base, source=source, sink=sink)
        line = str(caught.value)
        assert "\n" not in line and "sink: IcebergSink(partition_by)" in line
        return line

    assert "does not match" in refused(sink={"partition_by": "user_id"})
    assert "does not match" in refused(sink={"partition_by": None})
    assert "landing days" in refused(event_time=None)
    assert "nullable" in refused(required=["event_id"])
    assert "no partitions" in refused(partition_by=None, sink={"partition_by": "event_time"})


def day_spec(schema: Any) -> PartitionSpec:
    source = schema.find_field("event_time").field_id
    return PartitionSpec(PartitionField(source, 1000, DayTransform(), "event_time_day"))


def test_an_existing_table_with_an_incompatible_schema_is_refused(
    demo: tuple[Settings, Platform],
) -> None:
    settings, plat = demo
    catalog = open_catalog(plat.engine, None, None)
    ensure_namespace(catalog, settings.source_name, default_warehouse(settings))
    arrow = pa.schema([("event_id", pa.int64()), ("event_time", pa.timestamp("us", "UTC"))])
    schema = iceberg_schema(arrow)  # event_id: long where the pipeline writes strings
    catalog.create_table(table_name(settings), schema=schema, partition_spec=day_spec(schema))
    line = refusal(settings, iceberg_pipeline(settings))
    assert "IcebergSink(table)" in line and "'event_id' is long" in line
    # A table partitioned otherwise than the pipeline's days: refused too.
    other = f"{settings.source_name}.flat"
    catalog.create_table(other, schema=schema)
    line = refusal(settings, iceberg_pipeline(settings, table=other))
    assert "IcebergSink(partition_by)" in line and "unpartitioned" in line


def test_an_unreachable_catalog_is_one_line_without_its_password(
    demo: tuple[Settings, Platform], monkeypatch: pytest.MonkeyPatch
) -> None:
    settings, _ = demo
    monkeypatch.setenv("PYICEBERG_CATALOG__NOPE__TYPE", "sql")
    monkeypatch.setenv(
        "PYICEBERG_CATALOG__NOPE__URI", "postgresql+psycopg://u:s3cr3tpw@127.0.0.1:1/x"
    )
    monkeypatch.setattr(pyiceberg.catalog, "_ENV_CONFIG", Config())  # read at import
    line = refusal(settings, iceberg_pipeline(settings, catalog="nope"))
    assert "IcebergSink(catalog)" in line and "'nope'" in line
    assert "s3cr3tpw" not in line


def test_a_warehouse_that_cannot_be_written_is_refused(make_settings: Any, tmp_path: Path) -> None:
    blocker = tmp_path / "blocker"
    blocker.write_text("a file where the warehouse folder should be")
    settings: Settings = make_settings(warehouse_dir=str(blocker / "warehouse"))
    platform = open_platform(settings)
    try:
        prepare_demo(settings, platform)
        demo_discover(platform)
        line = refusal(settings, iceberg_pipeline(settings))
    finally:
        platform.close()
    assert line.startswith("SLUICE_WAREHOUSE_DIR") and "not a folder" in line


def test_a_data_file_whose_field_ids_do_not_match_the_table_is_never_added(
    platform: tuple[Settings, Platform], tmp_path: Path
) -> None:
    settings, plat = platform
    catalog = open_catalog(plat.engine, None, None)
    ensure_namespace(catalog, settings.source_name, default_warehouse(settings))
    arrow = pa.schema([("a", pa.string()), ("b", pa.string())])
    table = catalog.create_table(f"{settings.source_name}.ids", schema=iceberg_schema(arrow))
    rows = {"a": ["x"], "b": ["y"]}
    good, swapped = tmp_path / "good.parquet", tmp_path / "swapped.parquet"
    pq.write_table(pa.table(rows, schema=with_field_ids(arrow, {"a": 1, "b": 2})), good)
    pq.write_table(pa.table(rows, schema=with_field_ids(arrow, {"a": 2, "b": 1})), swapped)
    assert len(data_files(table, [{"staged": str(good)}])) == 1
    with pytest.raises(ValueError, match="field 'a' has id 2, the table's column has 1"):
        data_files(table, [{"staged": str(swapped)}])
