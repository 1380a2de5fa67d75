"""A continuous run over sparse input completes its days while it is alive (issue 21, 3).

The shape that failed: a user's own pipeline, two subtasks, one small file per day landing
every couple of seconds while one continuous run reads. Each subtask reads a file within
milliseconds and is idle (no split, nothing in flight) at nearly every barrier. Before, the
run watermark was the minimum over non-idle subtasks only, so with every subtask idle it
never advanced: ``run_watermarks.watermark`` stayed NULL and no day completed until the run
ended. Now, with every subtask idle, the run watermark is the greatest watermark their sinks
reached (Flink's ``StatusWatermarkValve``: all inputs idle → the maximum across them): the
day before the last one read completes at the next checkpoint, while the run stays alive.

Real Postgres, real local Spark; the files are registered and assigned to the live run as
the continuous sensor does (discover, then ``assign_to_run``).
"""

from __future__ import annotations

import itertools
import secrets
import threading
import time
from datetime import UTC, date, datetime, timedelta
from typing import Any

import orjson
import pyarrow as pa
import pytest
import sqlalchemy as sa
from conftest import TestSettings

from enumerator_service import SplitStore
from enumerator_service._completeness import partition_end
from enumerator_service._operations import discover, open_platform
from enumerator_service._schema import partition_completions, run_watermarks, splits
from spark_jobs import FileSource, Map, ParquetSink, Pipeline
from spark_jobs._spark import spark_for
from spark_jobs.jobs import run_pipeline
from spark_jobs.pipeline._paths import discovery_of

pytestmark = pytest.mark.spark

DAYS = [date(2026, 3, 1) + timedelta(days=i) for i in range(4)]
#: Between two files: several checkpoints (0.3 s) in which every subtask is idle.
GAP = 1.5
#: A subtask without a split for this long ends (as in the trial: longer than the test, so
#: every subtask stays open and is idle at nearly every barrier).
IDLE_EXIT = 300.0
WAIT = 30.0
#: Spark's start on a busy machine.
START = 150.0


def unchanged(batch: pa.RecordBatch) -> pa.RecordBatch:
    return batch


def sparse_pipeline(name: str) -> Pipeline:
    return Pipeline(
        name=name,
        source=FileSource(
            schema={"id": "string", "at": "timestamp"},
            required=["id", "at"],
            event_time="at",
            out_of_orderness="1s",
        ),
        steps=[Map(unchanged)],
        sink=ParquetSink(f"{name}_out"),
        key=["id"],
    )


def land(settings: TestSettings, name: str, day: date) -> None:
    """One small file of ``day``: three records, early, midday and late in the day."""
    folder = settings.data_path / "landing" / name / f"dt={day}"
    folder.mkdir(parents=True)
    start = datetime.combine(day, datetime.min.time(), tzinfo=UTC)
    lines = [
        orjson.dumps({"id": f"{day}-{h}", "at": (start + timedelta(hours=h)).isoformat()})
        for h in (0.5, 12, 23.5)
    ]
    (folder / "events.jsonl").write_bytes(b"\n".join(lines) + b"\n")


def test_a_continuous_run_completes_each_day_while_alive(make_settings: Any) -> None:
    settings: TestSettings = make_settings(
        parallelism=2,
        checkpoint_interval_seconds=0.3,
        continuous_poll_seconds=0.2,
        continuous_idle_seconds=IDLE_EXIT,
    )
    platform = open_platform(settings)
    name = f"sparse_{secrets.token_hex(3)}"
    pipeline = sparse_pipeline(name)
    run_id = f"{name}-c1"
    store = SplitStore(platform.engine)
    result: dict[str, Any] = {}

    def feed(day: date) -> None:
        land(settings, name, day)
        discover(platform, discovery_of(pipeline, settings))
        store.assign_to_run(run_id, name, lease_seconds=settings.lease_seconds)

    def reader() -> None:
        try:
            result["summary"] = run_pipeline(settings, pipeline, run_id=run_id, continuous=True)
        except BaseException as exc:  # shown by the test
            result["error"] = exc

    def completed() -> set[date]:
        with platform.engine.connect() as conn:
            return set(
                conn.execute(
                    sa.select(partition_completions.c.partition_key).where(
                        partition_completions.c.source == name
                    )
                ).scalars()
            )

    def wait_for(days: set[date], run: threading.Thread) -> None:
        deadline = time.monotonic() + WAIT
        while not days <= completed():
            assert run.is_alive(), ("the run ended first", result, completed())
            assert time.monotonic() < deadline, (days, completed(), watermark())
            time.sleep(0.1)

    def watermark() -> Any:
        with platform.engine.connect() as conn:
            return conn.execute(
                sa.select(run_watermarks).where(run_watermarks.c.run_id == run_id)
            ).first()

    def read(day: date) -> bool:
        with platform.engine.connect() as conn:
            states = conn.execute(
                sa.select(splits.c.status).where(
                    splits.c.source == name, splits.c.partition_key == day
                )
            ).scalars()
            return set(states) == {"COMPLETED"}

    run = threading.Thread(target=reader, daemon=True)
    try:
        feed(DAYS[0])
        run.start()
        # Spark is up and the first file read: from here on files arrive one by one.
        deadline = time.monotonic() + START
        while not read(DAYS[0]):
            assert run.is_alive() and time.monotonic() < deadline, result
            time.sleep(0.1)
        for before, day in itertools.pairwise(DAYS):
            time.sleep(GAP)
            feed(day)
            # The previous day's files are read and the next day's read moves event time
            # past its end: it completes while the run is alive.
            wait_for({before}, run)
        assert run.is_alive()
        assert DAYS[-1] not in completed()  # its event time has not passed yet
        live = watermark()
        assert live is not None and not live.finished
        assert live.watermark >= partition_end(DAYS[-2])
        with platform.engine.connect() as conn:
            rows = conn.execute(
                sa.select(partition_completions.c.rows).where(
                    partition_completions.c.source == name
                )
            ).scalars()
            assert list(rows) == [3] * (len(DAYS) - 1)  # each completed with all its rows
    finally:
        # Cancelled, as Dagster cancels a continuous run (it would idle for IDLE_EXIT).
        spark_for(settings).sparkContext.cancelAllJobs()
        run.join(WAIT)
        platform.close()
    assert not run.is_alive()
