"""A pipeline reading a Postgres table (``TableSource``) end to end on real Spark: the first
run reads every key range, a later run only the keys appended since, each row exactly once,
enriched by a lookup and written to an unpartitioned Parquet table — and the catalog check of
the declared columns."""

from __future__ import annotations

import secrets
from typing import Any

import pyarrow.dataset as ds
import pytest
import sqlalchemy as sa
from conftest import TestSettings

from enumerator_service._operations import discover, open_platform
from spark_jobs import Lookup, ParquetSink, Pipeline, PipelineDefinitionError, TableSource
from spark_jobs.connectors.parquet import output_path
from spark_jobs.jobs import run_pipeline
from spark_jobs.pipeline._paths import discovery_of

pytestmark = pytest.mark.spark


def _pipeline(name: str, table: str, schema: dict[str, str]) -> Pipeline:
    return Pipeline(
        name=name,
        source=TableSource(
            table,
            key="seq",
            schema=schema,
            required=["seq", "region"],
            rows_per_split=40,
        ),
        steps=[Lookup(f"{table}_regions", on={"region": "code"}, columns=["label"])],
        sink=ParquetSink(name),
        key=["seq"],
    )


def test_a_table_source_reads_each_row_once_and_then_only_appended_keys(
    make_settings: Any,
) -> None:
    settings: TestSettings = make_settings()
    platform = open_platform(settings)
    table = f"public.rows_{secrets.token_hex(3)}"
    schema = {"seq": "int64", "region": "string", "value": "decimal(10,2)", "at": "timestamp"}
    try:
        with platform.engine.begin() as conn:
            conn.execute(
                sa.text(
                    f"CREATE TABLE {table} (seq bigint PRIMARY KEY, region text,"
                    " value numeric(10,2), at timestamptz, ignored text)"
                )
            )
            conn.execute(
                sa.text(f"CREATE TABLE {table}_regions (code text PRIMARY KEY, label text)")
            )
            conn.execute(
                sa.text(f"INSERT INTO {table}_regions VALUES ('n', 'North'), ('s', 'South')")
            )
            conn.execute(
                sa.text(
                    f"INSERT INTO {table} SELECT g, (ARRAY['n','s','w'])[1 + g % 3], g / 4.0,"
                    " '2026-01-01'::timestamptz + g * interval '1 minute', 'x'"
                    " FROM generate_series(1, 200) g"
                )
            )
        pipeline = _pipeline(f"tbl_{secrets.token_hex(3)}", table, schema)
        assert not pipeline.plan.source.partitioned
        first = discover(platform, discovery_of(pipeline, settings))
        assert first.splits_registered == 5  # 200 keys, ~40 per range
        summary = run_pipeline(settings, pipeline)
        assert (summary.rows_out, summary.dead_letters) == (200, 0)
        with platform.engine.begin() as conn:
            conn.execute(
                sa.text(
                    f"INSERT INTO {table} SELECT g, 'n', g, now(), 'x'"
                    " FROM generate_series(201, 230) g"
                )
            )
            conn.execute(sa.text(f"UPDATE {table} SET value = -1 WHERE seq <= 200"))  # not re-read
        discover(platform, discovery_of(pipeline, settings))
        again = run_pipeline(settings, pipeline)
        assert again.rows_out == 30
        folder = output_path(pipeline, settings)
        assert not any(p.name.startswith("dt=") for p in folder.iterdir())  # unpartitioned
        rows = ds.dataset(folder, format="parquet").to_table().to_pylist()
        assert sorted(r["seq"] for r in rows) == list(range(1, 231))
        labels = {r["seq"]: r["label"] for r in rows}
        assert (labels[3], labels[4], labels[5]) == ("North", "South", None)  # 'w' has none
        assert all(r["value"] >= 0 for r in rows if r["seq"] <= 200)
        assert "ignored" not in rows[0]
    finally:
        platform.close()


def test_declared_columns_are_checked_against_the_catalog(make_settings: Any) -> None:
    settings: TestSettings = make_settings()
    platform = open_platform(settings)
    table = f"public.rows_{secrets.token_hex(3)}"
    try:
        with platform.engine.begin() as conn:
            conn.execute(sa.text(f"CREATE TABLE {table} (seq bigint PRIMARY KEY, region text)"))
            conn.execute(
                sa.text(f"CREATE TABLE {table}_regions (code text PRIMARY KEY, label text)")
            )
        wrong = _pipeline("tbl_wrong", table, {"seq": "int64", "region": "int32"})
        with pytest.raises(PipelineDefinitionError, match="field 'region' is declared int32"):
            run_pipeline(settings, wrong)
        missing = _pipeline("tbl_missing", table, {"seq": "int64", "region": "string", "x": "bool"})
        with pytest.raises(PipelineDefinitionError, match="has no column 'x'"):
            run_pipeline(settings, missing)
        both = _pipeline("tbl_both", table, {"seq": "string", "region": "int32", "x": "bool"})
        with pytest.raises(PipelineDefinitionError) as every:  # every field, in one line
            run_pipeline(settings, both)
        line = str(every.value)
        assert "\n" not in line and line.count("; ") == 2, line
        assert "field 'seq' is declared string" in line and "has no column 'x'" in line
        assert "field 'region' is declared int32" in line
    finally:
        platform.close()
