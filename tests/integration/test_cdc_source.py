"""The Postgres CDC source end to end on real Spark and the test server (wal_level=logical):
a snapshot of the rows present, then the slot's changes, into a Postgres upsert sink that
applies deletes — the sink equals the source table (missing 0, extra 0, duplicates 0,
differing 0), and the slot is advanced only to offsets completed checkpoints committed."""

from __future__ import annotations

import secrets
from typing import Any

import pytest
import sqlalchemy as sa
from cdc_oracle import ChangeGenerator, compare, create_table, rows_of
from conftest import TestSettings

from enumerator_service import splits
from enumerator_service._operations import discover, open_platform
from spark_jobs import Pipeline, PostgresCdcSource, PostgresSink
from spark_jobs.connectors.postgres_cdc import drop_slot, slot_info
from spark_jobs.jobs import run_pipeline
from spark_jobs.pipeline._paths import discovery_of

pytestmark = pytest.mark.spark


def cdc_pipeline(name: str, table: str, *, rows_per_chunk: int = 40) -> Pipeline:
    return Pipeline(
        name=name,
        source=PostgresCdcSource(
            tables=[table],
            key="id",
            schema={"id": "int64", "v": "string", "n": "int64"},
            rows_per_chunk=rows_per_chunk,
        ),
        sink=PostgresSink(f"{table}_out", upsert_key=["id"]),
    )


def stream_splits(engine: sa.Engine, source: str) -> list[Any]:
    with engine.connect() as conn:
        return list(
            conn.execute(
                sa.select(splits.c.start_offset, splits.c.status, splits.c.committed_offset)
                .where(splits.c.source == source, splits.c.kind == "pgcdc")
                .order_by(splits.c.start_offset)
            )
        )


def test_snapshot_then_changes_in_bounded_runs_make_the_sink_equal_the_table(
    make_settings: Any,
) -> None:
    settings: TestSettings = make_settings(parallelism=1, checkpoint_interval_seconds=0.5)
    platform = open_platform(settings)
    table = f"public.cdc_{secrets.token_hex(3)}"
    name = f"cdc_{secrets.token_hex(3)}"
    pipeline = cdc_pipeline(name, table)
    options = pipeline.plan.source.options
    try:
        create_table(platform.engine, table, rows=100)
        # Run 1: the snapshot (3 chunks); the stream waits until they are committed.
        first = discover(platform, discovery_of(pipeline, settings))
        assert first.splits_registered == 3
        assert discover(platform, discovery_of(pipeline, settings)).splits_registered == 0
        summary = run_pipeline(settings, pipeline)
        assert summary.rows_out == 100
        changes = ChangeGenerator(platform.url, table, first_new_key=100, max_ops=300)
        changes.start()
        changes.finish()
        assert changes.ops.get("delete") and changes.ops.get("rekey") and changes.ops.get("hot")
        # Run 2: the stream split from the slot's start, read up to now.
        assert discover(platform, discovery_of(pipeline, settings)).splits_registered == 1
        run_pipeline(settings, pipeline)
        diff = compare(rows_of(platform.engine, table), rows_of(platform.engine, f"{table}_out"))
        assert diff.equal, str(diff)
        # Run 3: more changes, the next stream split from where the last one ended.
        more = ChangeGenerator(platform.url, table, first_new_key=10_000, max_ops=200)
        more.start()
        more.finish()
        assert discover(platform, discovery_of(pipeline, settings)).splits_registered == 1
        (_, done, reached), (start, _, _) = stream_splits(platform.engine, name)
        assert done == "COMPLETED" and start == reached
        with platform.engine.connect() as conn:
            info = slot_info(conn, options.slot)
        # The idle slot was advanced to what the completed split committed, not further.
        assert info is not None and info.confirmed_flush == reached and not info.active
        run_pipeline(settings, pipeline)
        diff = compare(rows_of(platform.engine, table), rows_of(platform.engine, f"{table}_out"))
        assert diff.equal, str(diff)
        with platform.engine.connect() as conn:
            info = slot_info(conn, options.slot)
        last = stream_splits(platform.engine, name)[-1]
        assert info is not None and info.confirmed_flush is not None
        assert info.confirmed_flush <= last.committed_offset
    finally:
        drop_slot(platform.engine, options.slot, options.publication)
        platform.close()
