"""The Delta sink's spec, paths and file descriptions without I/O beyond a temp folder: the
table location from SLUICE_WAREHOUSE_DIR and DeltaSink(path=...), one-line refusals when a
pipeline is defined, describe(), the delta-rs storage options (no secret in them), where a
rebuild's files go, and the statistics of a data file."""

from __future__ import annotations

import dataclasses
import json
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from enumerator_service import StorageOptions, load_settings, open_location
from examples.clickstream import clickstream
from examples.orders import orders
from spark_jobs import DeltaSink, Pipeline
from spark_jobs.connectors import sink_connector
from spark_jobs.connectors.delta import delta_storage, table_location
from spark_jobs.connectors.delta._writer import data_folder, file_stats, rebuild_of
from spark_jobs.pipeline._errors import PipelineDefinitionError


def with_sink(**sink: Any) -> Pipeline:
    return dataclasses.replace(clickstream, sink=DeltaSink(**sink))


def test_the_table_location(tmp_path: Path) -> None:
    local = load_settings(warehouse_dir=tmp_path / "wh")
    s3 = load_settings(warehouse_dir="s3://bucket/wh")
    assert table_location(with_sink(path="lake/events"), local).uri == str(
        tmp_path / "wh/lake/events"
    )
    assert table_location(with_sink(path="lake/events"), s3).uri == "s3://bucket/wh/lake/events"
    absolute = str(tmp_path / "t")
    assert table_location(with_sink(path=absolute), s3).uri == absolute
    assert table_location(with_sink(path=f"file://{absolute}"), s3).uri == absolute
    assert table_location(with_sink(path="s3://o/lake/t"), local).uri == "s3://o/lake/t"


@pytest.mark.parametrize(
    ("sink", "problem"),
    [
        ({"path": "../x"}, "leads out of the warehouse"),
        ({"path": "s3://bucket"}, "needs a prefix below the bucket"),
        ({"path": "s3://key:secret@bucket/t"}, "credentials"),
        ({"path": "lake/t", "compression": "lzma"}, "compression must be one of"),
        ({"path": "lake/t", "upsert_key": []}, "upsert_key must name at least one field"),
        ({"path": "lake/t", "upsert_key": ["nope"]}, "'nope' is not in the input"),
        ({"path": "lake/t", "partition_by": "bad name"}, "partition_by"),
    ],
)
def test_a_bad_sink_is_refused_in_one_line_when_defined(sink: dict[str, Any], problem: str) -> None:
    with pytest.raises(PipelineDefinitionError) as caught:
        _ = with_sink(**sink).plan
    message = str(caught.value)
    assert problem in message and "\n" not in message, message
    assert "secret" not in message


def test_describe_says_where_and_how() -> None:
    connector = sink_connector(DeltaSink("x"))
    assert connector is not None
    plan = with_sink(path="lake/events").plan
    assert connector.describe(plan) == "delta table lake/events, partitioned by dt, append"
    upsert = dataclasses.replace(orders, sink=DeltaSink("lake/o", upsert_key=["order_id"])).plan
    assert connector.describe(upsert) == "delta table lake/o, partitioned by dt, upsert on order_id"
    assert connector.can_replace(plan.sink)
    assert not connector.can_replace(with_sink(path="t", partition_by=None).plan.sink)


def test_delta_rs_gets_the_endpoint_and_region_only(tmp_path: Path) -> None:
    options = StorageOptions(s3_endpoint_url="http://127.0.0.1:9000", s3_region="eu-west-1")
    storage = delta_storage(open_location("s3://bucket/lake/t", options))
    assert storage == {
        "AWS_ENDPOINT_URL": "http://127.0.0.1:9000",
        "AWS_ALLOW_HTTP": "true",
        "AWS_REGION": "eu-west-1",
    }
    assert delta_storage(open_location(tmp_path / "t", options)) == {}


def test_a_rebuilds_files_go_into_its_days_folder() -> None:
    assert data_folder("_rebuilds/dt=2026-01-02/17") == "dt=2026-01-02/rebuild-17"
    assert data_folder("dt=2026-01-02") == "dt=2026-01-02"
    assert data_folder("") == ""
    assert rebuild_of("dt=2026-01-02/rebuild-17/part-r-t000-a-000001.parquet") == 17
    assert rebuild_of("dt=2026-01-02/part-r-t000-a-000001.parquet") is None
    assert rebuild_of("part-r-t000-a-000001.parquet") is None


def test_file_statistics_are_what_is_sure(tmp_path: Path) -> None:
    at = datetime(2026, 1, 2, 3, 4, 5, 6, tzinfo=UTC)
    long_text = "x" * 40
    table = pa.table(
        {
            "id": pa.array([3, 1, None], pa.int64()),
            "at": pa.array([at, at, at], pa.timestamp("us", tz="UTC")),
            "day": pa.array([date(2026, 1, 2)] * 3, pa.date32()),
            "name": pa.array(["b", long_text, "a"]),
            "score": pa.array([1.5, float("nan"), 2.0]),
            "tags": pa.array([[1], [2], []], pa.list_(pa.int64())),
        }
    )
    pq.write_table(table, tmp_path / "f.parquet", row_group_size=2)
    stats = json.loads(file_stats(pq.read_metadata(tmp_path / "f.parquet"), 3))
    assert stats["numRecords"] == 3
    assert (stats["minValues"]["id"], stats["maxValues"]["id"], stats["nullCount"]["id"]) == (
        1,
        3,
        1,
    )
    assert stats["minValues"]["at"] == stats["maxValues"]["at"] == "2026-01-02T03:04:05.000006Z"
    assert stats["minValues"]["day"] == "2026-01-02"
    assert "name" not in stats["maxValues"]  # a value longer than Delta keeps: no bound
    assert "score" not in stats["minValues"]  # floats (NaN): no bound
    assert "tags" not in stats["nullCount"]  # nested: nothing
