"""The Postgres CDC source end to end on real Spark and the test server (wal_level=logical):
a snapshot of the rows present, then the slot's changes, into a Postgres upsert sink that
applies deletes — the sink equals the source table (missing 0, extra 0, duplicates 0,
differing 0), and the slot is advanced only to offsets completed checkpoints committed."""

from __future__ import annotations

import dataclasses
import secrets
import threading
import time
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from cdc_oracle import ChangeGenerator, cdc_pipeline, compare, create_table, rows_of
from conftest import TestSettings
from deltalake import DeltaTable

from enumerator_service import END_OF_INPUT, SplitStore, splits
from enumerator_service._live_state import live_state, run_watermark
from enumerator_service._operations import discover, open_platform
from spark_jobs import DeltaSink, IcebergSink, Lookup
from spark_jobs._spark import spark_for
from spark_jobs.connectors.iceberg._catalog import open_catalog
from spark_jobs.connectors.postgres_cdc import drop_slot, slot_info
from spark_jobs.jobs import run_pipeline
from spark_jobs.pipeline._paths import discovery_of

pytestmark = pytest.mark.spark

#: Spark's start on a busy machine; a continuous run's catch-up; a cancelled run's end.
START = 150.0
CATCH_UP = 60.0
WAIT = 30.0


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
        first_run = _server_clock(platform.engine)
        summary = run_pipeline(settings, pipeline)
        assert summary.rows_out == 100
        with platform.engine.connect() as conn:  # the chunks' rows carry when they were read
            snapshot = live_state(conn, name, first_run).watermark
        assert snapshot is not None and first_run - timedelta(seconds=5) < snapshot < END_OF_INPUT
        changes = ChangeGenerator(platform.url, table, first_new_key=100, max_ops=300)
        changes.start()
        changes.finish()
        assert changes.ops.get("delete") and changes.ops.get("rekey") and changes.ops.get("hot")
        # Run 2: the stream split from the slot's start, read up to now.
        assert discover(platform, discovery_of(pipeline, settings)).splits_registered == 1
        before = _server_clock(platform.engine)
        run_pipeline(settings, pipeline)
        diff = compare(rows_of(platform.engine, table), rows_of(platform.engine, f"{table}_out"))
        assert diff.equal, str(diff)
        # A bounded run read the stream up to its start, not to an end: the output is
        # current as of the marker it wrote then (less out_of_orderness, 5 s), and the lag
        # grows until the next run (watermark_freshness sees a schedule that stopped).
        with platform.engine.connect() as conn:
            state = live_state(conn, name, before + timedelta(hours=1))
        assert state.watermark is not None and state.watermark < END_OF_INPUT, state
        assert before - timedelta(seconds=5) < state.watermark < _server_clock(platform.engine)
        assert state.watermark_lag_seconds is not None and state.watermark_lag_seconds > 3600
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


def _server_clock(engine: sa.Engine) -> datetime:
    with engine.connect() as conn:
        now: datetime = conn.execute(sa.text("SELECT clock_timestamp()")).scalar_one()
    return now


def reading(engine: sa.Engine, source: str) -> bool:
    with engine.connect() as conn:
        return bool(
            conn.execute(
                sa.select(sa.func.count()).where(
                    splits.c.source == source, splits.c.status.in_(["READING", "COMPLETED"])
                )
            ).scalar_one()
        )


def wait_equal(
    engine: sa.Engine, table: str, run: threading.Thread, result: dict[str, Any]
) -> None:
    """Until the sink equals the table (the continuous run catches up), or fail showing how
    they differ."""
    deadline = time.monotonic() + CATCH_UP
    while True:
        diff = compare(rows_of(engine, table), rows_of(engine, f"{table}_out"))
        if diff.equal:
            return
        assert run.is_alive(), ("the run ended", result, str(diff))
        assert time.monotonic() < deadline, str(diff)
        time.sleep(0.5)


@pytest.mark.parametrize(
    "rows",
    [
        3_000,
        pytest.param(200_000, marks=pytest.mark.extended),
        pytest.param(1_000_000, marks=pytest.mark.extended),
    ],
)
def test_a_continuous_run_under_concurrent_changes_ends_equal_to_the_table(
    make_settings: Any, rows: int
) -> None:
    """Snapshot chunks read while a writer changes the table, then the stream under the same
    writer: the sink catches up to the table exactly."""
    settings: TestSettings = make_settings(
        parallelism=2,
        checkpoint_interval_seconds=0.5,
        continuous_poll_seconds=0.2,
        continuous_idle_seconds=300,
    )
    platform = open_platform(settings)
    table = f"public.cdc_{secrets.token_hex(3)}"
    name = f"cdc_{secrets.token_hex(3)}"
    base = cdc_pipeline(name, table, rows_per_chunk=max(500, rows // 8))
    # Through a keyed lookup, as the acceptance pipeline (most values have no match: kept).
    pipeline = dataclasses.replace(
        base, steps=[Lookup(f"{table}_dim", on={"v": "code"}, columns=["label"])]
    )
    options = pipeline.plan.source.options
    run_id = f"{name}-c1"
    store = SplitStore(platform.engine)
    result: dict[str, Any] = {}

    def reader() -> None:
        try:
            result["summary"] = run_pipeline(settings, pipeline, run_id=run_id, continuous=True)
        except BaseException as exc:  # shown by the test
            result["error"] = exc

    def feed() -> None:  # what the continuous sensor does on each tick
        discover(platform, discovery_of(pipeline, settings))
        store.assign_to_run(run_id, name, lease_seconds=settings.lease_seconds)

    run = threading.Thread(target=reader, daemon=True)
    changes = ChangeGenerator(platform.url, table, first_new_key=rows + 1_000, pause=0.003)
    try:
        create_table(platform.engine, table, rows=rows)
        with platform.engine.begin() as conn:
            conn.execute(sa.text(f"CREATE TABLE {table}_dim (code text PRIMARY KEY, label text)"))
            conn.execute(sa.text(f"INSERT INTO {table}_dim VALUES ('hot1', 'one'), ('b', 'bee')"))
        feed()
        run.start()
        deadline = time.monotonic() + START
        while not [s for s in stream_splits(platform.engine, name) if s.status == "READING"]:
            assert run.is_alive() and time.monotonic() < deadline, result
            feed()
            if not changes.is_alive() and reading(platform.engine, name):
                changes.start()  # the snapshot is being read: changes during it
            time.sleep(0.5)
        time.sleep(4)  # the stream under concurrent changes
        changes.stop()
        assert sum(changes.ops.values()) > 200, changes.ops
        wait_equal(platform.engine, table, run, result)
        # Caught up on a quiet table: the run's watermark passes the last commit and
        # follows the clock (the reader's markers are heartbeats), it does not stop there.
        with platform.engine.connect() as conn:
            quiet = conn.execute(sa.text("SELECT clock_timestamp()")).scalar_one()
        deadline = time.monotonic() + CATCH_UP
        while True:
            with platform.engine.connect() as conn:
                mark = run_watermark(conn, name, run_id)
            if mark is not None and mark > quiet:
                break
            assert run.is_alive() and time.monotonic() < deadline, (mark, quiet, result)
            time.sleep(0.5)

        with platform.engine.connect() as conn:
            looked_up = conn.execute(
                sa.text(
                    f"SELECT count(*) FILTER (WHERE v = 'b'), count(*) FILTER (WHERE label = 'bee')"
                    f" FROM {table}_out"
                )
            ).one()
            info = slot_info(conn, options.slot)
        assert info is not None
        (stream,) = stream_splits(platform.engine, name)
        assert info.confirmed_flush is not None and stream.committed_offset is not None
        assert info.confirmed_flush <= stream.committed_offset  # never past a commit
        assert looked_up[0] > 0 and looked_up[0] == looked_up[1]  # every 'b' row looked up
        # While the run reads the slot, its reader advances it to committed offsets.
        deadline = time.monotonic() + 20
        while True:
            with platform.engine.connect() as conn:
                info = slot_info(conn, options.slot)
            (stream,) = stream_splits(platform.engine, name)
            assert info is not None and info.confirmed_flush is not None
            assert info.confirmed_flush <= stream.committed_offset
            if info.confirmed_flush > stream.start_offset:
                break
            assert time.monotonic() < deadline, (info, stream)
            time.sleep(0.5)
    finally:
        if changes.is_alive():
            changes.stop()
        spark_for(settings).sparkContext.cancelAllJobs()
        run.join(WAIT)
        drop_slot(platform.engine, options.slot, options.publication)
        platform.close()
    assert not run.is_alive()


def _lake_rows(kind: str, sink: Any, engine: sa.Engine) -> list[tuple[Any, ...]]:
    if kind == "iceberg":
        table = open_catalog(engine, None, None).load_table(sink.table)
        found = table.scan(selected_fields=("id", "v", "n")).to_arrow().to_pylist()
    else:
        found = DeltaTable(str(sink.path)).to_pyarrow_table(columns=["id", "v", "n"]).to_pylist()
    return sorted((r["id"], r["v"], r["n"]) for r in found)


@pytest.mark.parametrize("kind", ["iceberg", "delta"])
def test_lakehouse_upsert_sinks_apply_the_changes_and_deletes(
    make_settings: Any, tmp_path: Path, kind: str
) -> None:
    settings: TestSettings = make_settings(parallelism=1, checkpoint_interval_seconds=0.5)
    platform = open_platform(settings)
    table = f"public.cdc_{secrets.token_hex(3)}"
    name = f"cdc_{secrets.token_hex(3)}"
    sink: Any = (
        IcebergSink(f"{name}.copy", upsert_key=["id"])
        if kind == "iceberg"
        else DeltaSink(tmp_path / "lake" / name, upsert_key=["id"])
    )
    pipeline = dataclasses.replace(cdc_pipeline(name, table), sink=sink)
    options = pipeline.plan.source.options
    try:
        create_table(platform.engine, table, rows=60)
        discover(platform, discovery_of(pipeline, settings))
        run_pipeline(settings, pipeline)
        changes = ChangeGenerator(platform.url, table, first_new_key=100, max_ops=150, seed=11)
        changes.start()
        changes.finish()
        assert changes.ops.get("delete") and changes.ops.get("rekey")
        assert discover(platform, discovery_of(pipeline, settings)).splits_registered == 1
        run_pipeline(settings, pipeline)
        diff = compare(rows_of(platform.engine, table), _lake_rows(kind, sink, platform.engine))
        assert diff.equal, str(diff)
    finally:
        drop_slot(platform.engine, options.slot, options.publication)
        platform.close()


def test_a_cancelled_continuous_run_resumes_from_its_committed_offset(make_settings: Any) -> None:
    """A continuous run cancelled while the writer changes the table (its uncommitted work
    goes back to the pool); a bounded run then resumes the stream split from its committed
    offset, read from the slot: the sink equals the table."""
    settings: TestSettings = make_settings(
        parallelism=1,
        checkpoint_interval_seconds=0.5,
        continuous_poll_seconds=0.2,
        continuous_idle_seconds=300,
    )
    platform = open_platform(settings)
    table = f"public.cdc_{secrets.token_hex(3)}"
    name = f"cdc_{secrets.token_hex(3)}"
    pipeline = cdc_pipeline(name, table, rows_per_chunk=200)
    options = pipeline.plan.source.options
    run_id = f"{name}-c1"
    store = SplitStore(platform.engine)
    result: dict[str, Any] = {}

    def reader() -> None:
        try:
            result["summary"] = run_pipeline(settings, pipeline, run_id=run_id, continuous=True)
        except BaseException as exc:  # cancelled: expected
            result["error"] = exc

    run = threading.Thread(target=reader, daemon=True)
    changes = ChangeGenerator(platform.url, table, first_new_key=2_000, pause=0.003, seed=5)
    try:
        create_table(platform.engine, table, rows=600)
        discover(platform, discovery_of(pipeline, settings))
        run.start()
        deadline = time.monotonic() + START
        while not [s for s in stream_splits(platform.engine, name) if s.status == "READING"]:
            assert run.is_alive() and time.monotonic() < deadline, result
            discover(platform, discovery_of(pipeline, settings))
            store.assign_to_run(run_id, name, lease_seconds=settings.lease_seconds)
            time.sleep(0.5)
        changes.start()
        time.sleep(3)
        spark_for(settings).sparkContext.cancelAllJobs()  # while changes keep coming
        run.join(WAIT)
        assert not run.is_alive() and "error" in result
        time.sleep(1)
        changes.stop()
        (stream,) = stream_splits(platform.engine, name)
        assert stream.status == "UNASSIGNED" and stream.committed_offset is not None
        run_pipeline(settings, pipeline)  # bounded: resumes the split, up to now
        diff = compare(rows_of(platform.engine, table), rows_of(platform.engine, f"{table}_out"))
        assert diff.equal, str(diff)
        (stream,) = stream_splits(platform.engine, name)
        assert stream.status == "COMPLETED"
    finally:
        if changes.is_alive():
            changes.stop()
        if run.is_alive():
            spark_for(settings).sparkContext.cancelAllJobs()
            run.join(WAIT)
        drop_slot(platform.engine, options.slot, options.publication)
        platform.close()
