"""Where a Parquet sink's table and staging folders are, from SLUICE_WAREHOUSE_DIR and
ParquetSink(path=...): a local folder, file://, or an object-store URI (no I/O here)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from enumerator_service import ConfigError, load_settings
from examples.clickstream import clickstream
from spark_jobs import ParquetSink, Pipeline
from spark_jobs.connectors.parquet import output_path, output_root, staging_root
from spark_jobs.pipeline._errors import PipelineDefinitionError
from spark_jobs.pipeline._paths import warehouse_root


def with_path(path: str) -> Pipeline:
    return dataclasses.replace(clickstream, sink=ParquetSink("enriched_events", path=path))


def test_a_local_warehouse_is_as_before(tmp_path: Path) -> None:
    settings = load_settings(warehouse_dir=tmp_path / "wh")  # a Path is still accepted
    assert settings.warehouse_uri == str(tmp_path / "wh")
    assert output_path(clickstream, settings) == tmp_path / "wh" / "enriched_events"
    assert staging_root(clickstream, settings).uri == str(tmp_path / "wh/_staging/enriched_events")
    assert not output_root(clickstream, settings).object_store
    assert load_settings(warehouse_dir=f"file://{tmp_path}/wh").warehouse_path == tmp_path / "wh"


def test_an_s3_warehouse() -> None:
    settings = load_settings(warehouse_dir="s3://bucket/prefix/wh")
    table, staging = output_root(clickstream, settings), staging_root(clickstream, settings)
    assert (table.uri, table.path) == (
        "s3://bucket/prefix/wh/enriched_events",
        "bucket/prefix/wh/enriched_events",
    )
    assert staging.uri == "s3://bucket/prefix/wh/_staging/enriched_events"
    assert table.object_store and warehouse_root(settings).uri == "s3://bucket/prefix/wh"
    # At the bucket root too: the table is a prefix below it.
    root = load_settings(warehouse_dir="s3://bucket")
    assert staging_root(clickstream, root).uri == "s3://bucket/_staging/enriched_events"
    with pytest.raises(ConfigError, match=r"^SLUICE_WAREHOUSE_DIR: s3://bucket/prefix/wh is not"):
        _ = settings.warehouse_path


def test_a_sink_path(tmp_path: Path) -> None:
    local = load_settings(warehouse_dir=tmp_path / "wh")
    s3 = load_settings(warehouse_dir="s3://bucket/wh")
    relative = with_path("sales/events")
    assert output_path(relative, local) == tmp_path / "wh/sales/events"
    assert output_root(relative, s3).uri == "s3://bucket/wh/sales/events"
    assert staging_root(relative, s3).uri == "s3://bucket/wh/sales/_staging/events"
    elsewhere = with_path("s3://other/lake/events")
    for settings in (local, s3):
        assert output_root(elsewhere, settings).uri == "s3://other/lake/events"
        assert staging_root(elsewhere, settings).uri == "s3://other/lake/_staging/events"
    absolute = with_path(str(tmp_path / "out" / "events"))
    assert output_path(absolute, s3) == tmp_path / "out/events"


@pytest.mark.parametrize(
    ("path", "problem"),
    [
        ("../events", "leads out of the warehouse folder"),
        ("s3://bucket", "needs a prefix below the bucket root"),
        ("ftp://host/events", "unsupported scheme 'ftp://'"),
        ("s3://key:secret@bucket/events", "credentials do not belong in the URI"),
        ("", "is not a folder path or URI"),
    ],
)
def test_a_bad_sink_path_is_refused_when_defined(path: str, problem: str) -> None:
    with pytest.raises(PipelineDefinitionError) as refused:
        with_path(path)
    assert problem in str(refused.value) and "\n" not in str(refused.value)
    assert "secret" not in str(refused.value).replace("credentials", "")


def test_an_unsupported_warehouse_scheme_is_one_line() -> None:
    with pytest.raises(ConfigError) as refused:
        output_root(clickstream, load_settings(warehouse_dir="ftp://host/wh"))
    assert str(refused.value).startswith("SLUICE_WAREHOUSE_DIR: unsupported scheme 'ftp://'")
