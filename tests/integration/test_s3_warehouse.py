"""The Parquet sink with the warehouse on S3: a real S3-protocol server (moto on 127.0.0.1,
``tests/s3_server.py``) through pyarrow's S3 client, a real Postgres and real local Spark.

- a Dagster backfill of two days equals the landing oracle exactly once, its checks pass
  on the bucket, and the revenue example's aggregate of a day is written to it;
- a day's rebuild interrupted mid-swap (after the copies, before the deletes) ends, after
  recovery, in exactly the new output for the day;
- a publish interrupted by the endpoint going away (after the Postgres commit) fails the run
  visibly and the next run's recovery finishes it: duplicates=0 missing=0;
- bad input (unsupported scheme, missing bucket, unreachable endpoint, refused credentials,
  a sink path at a bucket root) is one line naming the setting and the URI.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import posixpath
import secrets
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import date
from typing import Any

import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest
import sqlalchemy as sa
from conftest import TestSettings as Settings
from demo_platform import demo_discover, demo_pipeline, demo_run, prepare_demo
from landing_oracle import expected_events
from s3_server import ACCESS_KEY, REGION, SECRET_KEY, S3Server, s3_server, set_standard_chain
from sink_harness import DAY1, ORDERS, expected, orders

from enumerator_service import (
    ConfigError,
    Location,
    StagedTransaction,
    StorageOptions,
    open_location,
)
from enumerator_service._operations import Platform, open_platform
from enumerator_service._schema import partition_rebuilds, sink_transactions
from spark_jobs import ParquetSink
from spark_jobs.connectors.parquet import output_root, staging_of
from spark_jobs.jobs import run_pipeline
from spark_jobs.pipeline._errors import PipelineDefinitionError
from spark_jobs.pipeline._paths import warehouse_root
from spark_jobs.sink import _parquet, _rebuild_swap, build_sinks, finish_rebuilds
from spark_jobs.sink._object_store import file_paths
from spark_jobs.sink._rebuild_swap import MARKER, REBUILDS_FOLDER

pytestmark = pytest.mark.spark

DAY = date(2026, 1, 1)
OTHER_DAY = date(2026, 1, 2)

# The fake credentials in os.environ before any Spark session starts (see there).
set_standard_chain()


@pytest.fixture(scope="module")
def s3() -> Iterator[S3Server]:
    with s3_server() as server:
        yield server


@pytest.fixture
def on_s3(s3: S3Server, make_settings: Any) -> Iterator[tuple[Settings, Platform, str]]:
    """Settings whose warehouse is a fresh bucket's ``warehouse/`` prefix; demo landing
    files (local) discovered and the users table loaded."""
    bucket = f"sluice-{secrets.token_hex(4)}"
    s3.create_bucket(bucket)
    settings: Settings = make_settings(warehouse_dir=f"s3://{bucket}/warehouse")
    assert settings.s3_endpoint_url == s3.endpoint_url
    platform = open_platform(settings)
    prepare_demo(settings, platform)
    demo_discover(platform)
    yield settings, platform, bucket
    platform.close()


def objects(location: Location) -> list[str]:
    """Every object under ``location`` (paths relative to it)."""
    selector = pafs.FileSelector(location.path, recursive=True, allow_not_found=True)
    return sorted(
        posixpath.relpath(info.path, location.path)
        for info in location.fs.get_file_info(selector)
        if info.type == pafs.FileType.File
    )


def data_files(table: Location, day: date | None = None) -> list[str]:
    """The table's data files a reader lists (no ``_``/``.`` part), or those of one day."""
    found = [
        name
        for name in objects(table)
        if name.endswith(".parquet") and not any(p.startswith(("_", ".")) for p in name.split("/"))
    ]
    return [n for n in found if day is None or n.startswith(f"dt={day.isoformat()}/")]


def rows_of(table: Location, names: list[str]) -> list[dict[str, Any]]:
    return [
        row
        for name in names
        for row in pq.read_table(
            table.child(*name.split("/")).path, filesystem=table.fs
        ).to_pylist()
    ]


def day_content(table: Location, day: date) -> tuple[int, str]:
    rows = sorted(rows_of(table, data_files(table, day)), key=lambda row: row["event_id"])
    return len(rows), hashlib.sha256(json.dumps(rows, default=str).encode()).hexdigest()


def exactly_once(settings: Settings, table: Location) -> tuple[int, int]:
    """(duplicates, missing) of the published event ids against the landing oracle."""
    expected = Counter(str(e["event_id"]) for e in expected_events(settings.landing_path)[0])
    found = Counter(str(row["event_id"]) for row in rows_of(table, data_files(table)))
    duplicates = sum(n - 1 for n in found.values() if n > 1) + sum(
        n for key, n in found.items() if key not in expected
    )
    missing = sum(1 for key in expected if key not in found)
    return duplicates, missing


def test_a_run_and_an_interrupted_rebuild_on_s3(
    on_s3: tuple[Settings, Platform, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from dagster import DagsterInstance, materialize
    from sluice_resource import resource_for

    from dagster_project import pipeline_definitions
    from dagster_project._check_outcomes import outcomes_of
    from dagster_project._counts import partition_counts
    from dagster_project.assets import output_location
    from examples import clickstream_revenue

    settings, platform, bucket = on_s3
    pipeline = demo_pipeline(settings)
    table = output_root(pipeline, settings)
    assert table.uri == f"s3://{bucket}/warehouse/enriched_{settings.source_name}"

    # A Dagster backfill of both days in one run: the output asset and its checks.
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
    materialized = result.asset_materializations_for_node(pipeline.name)
    assert sorted(str(e.partition) for e in materialized) == [
        DAY.isoformat(),
        OTHER_DAY.isoformat(),
    ]
    metadata = {key: value.value for key, value in materialized[0].metadata.items()}
    checks = result.get_asset_check_evaluations()
    assert len(checks) == 2 * len(built.checks) and all(check.passed for check in checks)

    assert exactly_once(settings, table) == (0, 0)
    events = expected_events(settings.landing_path)[0]
    assert metadata["rows_out"] == len(events) > 0
    assert metadata["output"] == table.uri
    # Nothing staged is left, and nothing else than the days' files is in the table.
    name = f"enriched_{settings.source_name}"
    assert staging_of(table).uri == f"s3://{bucket}/warehouse/_staging/{name}"
    assert objects(staging_of(table)) == []
    assert {name.split("/")[0] for name in objects(table)} == {
        f"dt={DAY.isoformat()}",
        f"dt={OTHER_DAY.isoformat()}",
    }
    # Dagster's counts, checks and output location read the bucket.
    counts = {c.day: c for c in partition_counts(pipeline, settings, [DAY, OTHER_DAY])}
    for day in (DAY, OTHER_DAY):
        assert counts[day].reconciles, counts[day]
        assert counts[day].rows_out == sum(1 for e in events if e["event_time"].date() == day)
    assert outcomes_of(pipeline, settings, "unique_key", 0.5)([DAY])[DAY].passed
    assert outcomes_of(pipeline, settings, "rows_reconcile", 0.5)([OTHER_DAY])[OTHER_DAY].passed
    assert output_location(pipeline, settings, [DAY]) == f"{table.uri}/dt={DAY.isoformat()}"

    # The revenue example's aggregate and writer on the bucket (one object per day, replaced
    # in one PUT by a re-run), fed with the day read back from the bucket (its reader, the
    # Iceberg table by snapshot, is tested in tests/dagster/test_iceberg_revenue.py).
    day_files = [table.child(name).path for name in objects(table) if name.startswith(f"dt={DAY}")]
    day_rows = pq.read_table(day_files, filesystem=table.fs)
    (written,) = clickstream_revenue.aggregate_days(settings, {DAY: day_rows}).values()
    clickstream_revenue.write_days(settings, {DAY: written})
    revenue = warehouse_root(settings).child(clickstream_revenue.REVENUE_TABLE)
    assert objects(revenue) == [f"dt={DAY.isoformat()}/part-00000.parquet"]
    stored = pq.read_table(revenue.child(objects(revenue)[0]).path, filesystem=revenue.fs)
    assert stored.equals(written) and written.num_rows > 0
    day_events = [e for e in events if e["event_time"].date() == DAY]
    assert sum(written.column("events").to_pylist()) == len(day_events)
    assert sum(written.column("orders").to_pylist()) == sum(
        1 for e in day_events if e["event_type"] == "order"
    )
    clickstream_revenue.write_days(settings, {DAY: written})
    assert objects(revenue) == [f"dt={DAY.isoformat()}/part-00000.parquet"]

    # A rebuild of DAY whose swap dies after copying the new files, before deleting the old.
    before, content, untouched = (
        data_files(table, DAY),
        day_content(table, DAY),
        data_files(table, OTHER_DAY),
    )

    def crash_after_copies(new: Location, live: Location, rebuild_id: int, marker: str) -> None:
        for path in file_paths(new):
            live.fs.copy_file(path, live.child(posixpath.basename(path)).path)
        raise RuntimeError("simulated crash in the middle of the swap")

    monkeypatch.setattr(_rebuild_swap, "swap_objects", crash_after_copies)
    with pytest.raises(RuntimeError, match="simulated crash"):
        demo_run(settings, dates=[DAY], rebuild=True)
    monkeypatch.undo()
    # What a reader sees meanwhile (documented): both generations, never less than one.
    overlap = data_files(table, DAY)
    assert set(before) < set(overlap)
    assert day_content(table, DAY)[0] == 2 * content[0]

    # Recovery (any later run's finish_rebuilds) ends in exactly the new generation.
    sinks = build_sinks(platform.engine, StorageOptions.of(settings))
    (done,) = finish_rebuilds(platform.engine, table, sinks, source=settings.source_name)
    after = data_files(table, DAY)
    assert after and not set(after) & set(before)
    assert day_content(table, DAY) == content
    assert data_files(table, OTHER_DAY) == untouched
    marker = table.child(f"dt={DAY.isoformat()}", MARKER)
    with marker.fs.open_input_stream(marker.path) as handle:
        assert handle.read().decode() == str(done.id)
    assert not [name for name in objects(table) if name.startswith(REBUILDS_FOLDER)]
    with platform.engine.connect() as conn:
        statuses = conn.execute(
            sa.select(partition_rebuilds.c.status).where(
                partition_rebuilds.c.source == settings.source_name
            )
        ).scalars()
        assert list(statuses) == ["DONE"]
    assert exactly_once(settings, table) == (0, 0)
    (recounted,) = partition_counts(pipeline, settings, [DAY])
    assert recounted.reconciles and recounted.rows_out == content[0]
    # Again: nothing to do, nothing changes.
    assert finish_rebuilds(platform.engine, table, sinks, source=settings.source_name) == []
    assert data_files(table, DAY) == after


def test_a_publish_cut_off_by_the_endpoint_is_finished_by_recovery(
    on_s3: tuple[Settings, Platform, str], s3: S3Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings, platform, _bucket = on_s3
    table = output_root(demo_pipeline(settings), settings)
    publish = _parquet.ParquetSink.publish
    cut: list[int] = []

    def endpoint_gone(self: _parquet.ParquetSink, txns: Any) -> None:
        # Between the Postgres commit (done) and the publish: the endpoint goes away.
        cut.append(len(txns))
        s3.pause()
        try:
            publish(self, txns)
        finally:
            s3.resume()

    monkeypatch.setattr(_parquet.ParquetSink, "publish", endpoint_gone)
    with pytest.raises(RuntimeError, match="checkpoint coordinator failed") as failed:
        demo_run(settings)
    monkeypatch.undo()
    message = str(failed.value)
    assert cut and "\n" not in message and f"publishing {table.uri}/dt=" in message, message
    assert SECRET_KEY not in message and ACCESS_KEY not in message
    with platform.engine.connect() as conn:
        unpublished = conn.execute(
            sa.select(sa.func.count()).where(
                sink_transactions.c.source == settings.source_name,
                sink_transactions.c.committed,
                sa.not_(sink_transactions.c.published),
            )
        ).scalar_one()
    assert unpublished >= 1  # committed in Postgres, waiting for its publish

    demo_run(settings)  # recovery publishes it; the rest of the input is processed

    assert exactly_once(settings, table) == (0, 0)
    with platform.engine.connect() as conn:
        assert not conn.execute(
            sa.select(sink_transactions.c.id).where(
                sink_transactions.c.source == settings.source_name,
                sa.not_(sink_transactions.c.published),
            )
        ).first()
    assert objects(staging_of(table)) == []


def test_the_sink_stages_verifies_publishes_and_aborts_objects(s3: S3Server) -> None:
    """The writer and the commit side alone (no Spark, no Postgres): URIs in the entries,
    nothing in the table until the publish, an idempotent publish, an abort that deletes."""
    bucket = f"sluice-{secrets.token_hex(4)}"
    s3.create_bucket(bucket)
    options = StorageOptions(s3.endpoint_url, REGION)
    table = open_location(f"s3://{bucket}/wh/orders", options)
    with ThreadPoolExecutor(1) as io:
        writer = _parquet.ParquetSinkWriter(
            io,
            schema=ORDERS,
            dictionary=["Customer"],
            compression="zstd",
            staging_root=staging_of(table),
            output_root=table,
            run_id="run-1",
            subtask=0,
            attempt="a1",
        )
        batch = orders((1, "Ann", 10, "12.50"), (2, "Bob", 11, "0.01"))
        writer.write_batch(writer.output_partition(DAY1, None), batch)
        out = writer.pre_commit().result(timeout=30)
        (entry,) = out.files
        assert entry["staged"].startswith(f"s3://{bucket}/wh/_staging/orders/run-1/dt=2026-01-01/")
        assert entry["final"].startswith(f"s3://{bucket}/wh/orders/dt=2026-01-01/part-run-1-")
        assert objects(table) == []  # staged: nobody reads it yet
        sink = _parquet.ParquetSink(options)
        txn = StagedTransaction(1, "run-1", 0, "a1", 1, "parquet", out.files, out.rows)
        # A publisher that died after its copy, before deleting the staged object: the next
        # publish copies the same bytes to the same name again.
        staged, final = (open_location(entry[k], options) for k in ("staged", "final"))
        table.fs.copy_file(staged.path, final.path)
        sink.publish([txn])
        sink.publish([txn])  # idempotent: the same object, once
        (name,) = data_files(table)
        assert expected(
            pq.read_table(table.child(name).path, filesystem=table.fs).to_batches()[0]
        ) == expected(batch)
        assert objects(staging_of(table)) == []
        # A lost object (neither staged nor final) is reported, never skipped.
        table.fs.delete_file(table.child(name).path)
        with pytest.raises(FileNotFoundError, match="committed output is lost"):
            sink.publish([txn])
        # Abort deletes what was staged.
        writer.write_batch(writer.output_partition(DAY1, None), batch)
        again = writer.pre_commit().result(timeout=30)
        sink.abort([StagedTransaction(2, "run-1", 0, "a1", 2, "parquet", again.files, 2)])
        assert objects(staging_of(table)) == []


def _one_line_error(settings: Settings) -> str:
    with pytest.raises(ConfigError) as error:
        run_pipeline(settings, demo_pipeline(settings))
    text = str(error.value)
    assert "\n" not in text and SECRET_KEY not in text
    return text


def test_bad_object_store_input_is_one_line(
    s3: S3Server, make_settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    import moto.settings

    bucket = f"sluice-{secrets.token_hex(4)}"
    s3.create_bucket(bucket)
    good = f"s3://{bucket}/warehouse"

    text = _one_line_error(make_settings(warehouse_dir="ftp://files.example/warehouse"))
    assert text.startswith("SLUICE_WAREHOUSE_DIR: unsupported scheme 'ftp://'"), text

    text = _one_line_error(make_settings(warehouse_dir="s3://sluice-no-such-bucket/wh"))
    assert text.startswith("SLUICE_WAREHOUSE_DIR: s3://sluice-no-such-bucket/wh/"), text
    assert text.endswith(": bucket 'sluice-no-such-bucket' does not exist"), text

    unreachable = make_settings(warehouse_dir=good, s3_endpoint_url="http://127.0.0.1:1")
    text = _one_line_error(unreachable)
    assert text.startswith(f"SLUICE_WAREHOUSE_DIR: {good}/"), text
    assert ": the endpoint is unreachable (SLUICE_S3_ENDPOINT_URL" in text, text

    # moto checks signatures only when told to: every request is authenticated from now on,
    # and the test's key is no IAM user's.
    monkeypatch.setattr(moto.settings, "INITIAL_NO_AUTH_ACTION_COUNT", 0)
    text = _one_line_error(make_settings(warehouse_dir=good))
    assert text.startswith(f"SLUICE_WAREHOUSE_DIR: {good}/"), text
    assert ": the credentials were refused (standard chain" in text, text
    monkeypatch.undo()

    settings = make_settings(warehouse_dir=good)
    with pytest.raises(PipelineDefinitionError) as error:  # refused when it is defined
        dataclasses.replace(demo_pipeline(settings), sink=ParquetSink("t", path=f"s3://{bucket}"))
    text = str(error.value)
    assert "\n" not in text and "a table folder needs a prefix below the bucket root" in text
    with pytest.raises(PipelineDefinitionError) as error:
        dataclasses.replace(demo_pipeline(settings), sink=ParquetSink("t", path="gopher://x/y"))
    assert "unsupported scheme 'gopher://'" in str(error.value), error.value
