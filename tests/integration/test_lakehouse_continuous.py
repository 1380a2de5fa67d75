"""The lakehouse sinks in continuous mode (the third run mode; the CLI and Dagster backfills
are tested in the sinks' own files): one continuous run, files of four days landing one by one
and assigned to the live run as the continuous sensor does, days completing while it runs,
then the run cancelled as Dagster cancels it. The table (Iceberg: PyIceberg's scan; Delta:
delta-rs and Polars over the log's files) holds every record exactly once, and each
checkpoint that committed rows is in the table's history exactly once."""

from __future__ import annotations

import secrets
import threading
import time
from collections import Counter
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

import orjson
import polars as pl
import pytest
import sqlalchemy as sa
from conftest import TestSettings
from deltalake import DeltaTable

from enumerator_service import SplitStore
from enumerator_service._operations import discover, open_platform
from enumerator_service._schema import partition_completions, splits
from spark_jobs import DeltaSink, FileSource, IcebergSink, Pipeline
from spark_jobs._spark import spark_for
from spark_jobs.connectors.iceberg._catalog import open_catalog
from spark_jobs.connectors.iceberg._commit import CHECKPOINT_ID, RUN_ID
from spark_jobs.jobs import run_pipeline
from spark_jobs.pipeline._paths import discovery_of

# ~30 s a sink on a quiet machine, minutes on a loaded one: run by `make faults` (extended).
pytestmark = [pytest.mark.spark, pytest.mark.extended]

DAYS = [date(2026, 4, 1) + timedelta(days=i) for i in range(4)]
WAIT, START = 120.0, 240.0


def _land(settings: TestSettings, name: str, day: date, n: int) -> set[str]:
    """``n`` records of ``day`` (out of order) in one file; their ids."""
    folder = settings.data_path / "landing" / name / f"dt={day}"
    folder.mkdir(parents=True)
    start = datetime.combine(day, datetime.min.time(), tzinfo=UTC)
    ids = [f"{day}-{i}" for i in range(n)]
    lines = [
        orjson.dumps({"id": ident, "at": (start + timedelta(minutes=(i * 37) % 1440)).isoformat()})
        for i, ident in enumerate(ids)
    ]
    (folder / "part.jsonl").write_bytes(b"\n".join(lines) + b"\n")
    return set(ids)


def _pipeline(name: str, kind: str, tmp_path: Path) -> Pipeline:
    sink = (
        IcebergSink(f"{name}.events") if kind == "iceberg" else DeltaSink(str(tmp_path / "delta"))
    )
    return Pipeline(
        name=name,
        source=FileSource(
            schema={"id": "string", "at": "timestamp"},
            required=["id", "at"],
            event_time="at",
            out_of_orderness="1s",
        ),
        sink=sink,
        key=["id"],
    )


def _table_ids(kind: str, name: str, engine: Any, tmp_path: Path) -> tuple[Counter[str], list]:
    """(ids in the table, per checkpoint commit its (run, checkpoint id))."""
    if kind == "iceberg":
        table = open_catalog(engine, None, None).load_table(f"{name}.events")
        ids = Counter(table.scan(selected_fields=("id",)).to_arrow().column(0).to_pylist())
        commits = [
            (s.summary[RUN_ID], s.summary[CHECKPOINT_ID])
            for s in table.snapshots()
            if s.summary is not None and s.summary.get(CHECKPOINT_ID)
        ]
        return ids, commits
    delta = DeltaTable(str(tmp_path / "delta"))
    ids = Counter(delta.to_pyarrow_table(columns=["id"]).column(0).to_pylist())
    assert ids == Counter(pl.read_parquet(delta.file_uris())["id"].to_list())  # second engine
    commits = [
        (c["sluice.run-id"], c["sluice.checkpoint-id"])
        for c in delta.history()
        if "sluice.checkpoint-id" in c
    ]
    return ids, commits


@pytest.mark.parametrize("kind", ["iceberg", "delta"])
def test_a_continuous_run_into_a_lakehouse_table_is_exactly_once(
    make_settings: Any, tmp_path: Path, kind: str
) -> None:
    settings: TestSettings = make_settings(
        checkpoint_interval_seconds=0.3, continuous_poll_seconds=0.2, continuous_idle_seconds=300.0
    )
    platform = open_platform(settings)
    name = f"lake_{secrets.token_hex(3)}"
    pipeline = _pipeline(name, kind, tmp_path)
    run_id = f"{name}-c1"
    store = SplitStore(platform.engine)
    result: dict[str, Any] = {}
    expected: set[str] = set()

    def feed(day: date, n: int) -> None:
        expected.update(_land(settings, name, day, n))
        discover(platform, discovery_of(pipeline, settings))
        store.assign_to_run(run_id, name, lease_seconds=settings.lease_seconds)

    def reader() -> None:
        try:
            result["summary"] = run_pipeline(settings, pipeline, run_id=run_id, continuous=True)
        except BaseException as exc:  # shown by the test
            result["error"] = exc

    def completed() -> set[date]:
        with platform.engine.connect() as conn:
            query = sa.select(partition_completions.c.partition_key).where(
                partition_completions.c.source == name
            )
            return set(conn.execute(query).scalars())

    def read(day: date) -> bool:
        with platform.engine.connect() as conn:
            query = sa.select(splits.c.status).where(
                splits.c.source == name, splits.c.partition_key == day
            )
            return set(conn.execute(query).scalars()) == {"COMPLETED"}

    def wait(condition: Any, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while not condition():
            assert run.is_alive() and time.monotonic() < deadline, (result, completed())
            time.sleep(0.2)

    run = threading.Thread(target=reader, daemon=True)
    try:
        feed(DAYS[0], 50)
        run.start()
        wait(lambda: read(DAYS[0]), START)  # Spark is up, the first file read
        for before, day, n in zip(DAYS, DAYS[1:], (3, 200, 7), strict=False):
            feed(day, n)
            # The next day's records move event time past the previous day's end: it
            # completes while the run is alive.
            wait(lambda before=before: before in completed(), WAIT)
        wait(lambda: read(DAYS[-1]), WAIT)
        time.sleep(1.0)  # a few more checkpoints: the last day's rows commit too
    finally:
        spark_for(settings).sparkContext.cancelAllJobs()  # as Dagster cancels the run
        run.join(WAIT)
    try:
        assert not run.is_alive()
        ids, commits = _table_ids(kind, name, platform.engine, tmp_path)
        missing = expected - set(ids)
        # The last day's rows may still have been in flight when the run was cancelled: a
        # new run reads them (never twice).
        if missing:
            run_pipeline(settings, pipeline, run_id=f"{name}-c2")
            ids, commits = _table_ids(kind, name, platform.engine, tmp_path)
        assert set(ids) == expected and max(ids.values()) == 1  # missing 0, duplicates 0
        assert len(commits) == len(set(commits)) > 0  # every checkpoint committed once
    finally:
        platform.close()
