"""Acceptance of issue 14 (event time end to end): one continuous run, driven by the
continuous sensor as the daemon drives it, over three days of files that land out of order
while it runs — day 2's first, then day 1's, then day 3's — and a late file.

- Each day is recorded complete exactly once, and only once every in-time record of it is
  committed: the rows its checkpoints had committed to the day at the completion's checkpoint
  are all of the day's output rows, and no split of that day (or earlier) was unfinished.
- The completeness rule's split condition is exercised: an observer sees a day whose run
  watermark has passed it and which has committed rows held back while a split of it (two
  files a day, small splits, two subtasks) is still being read — and not completed then.
- A file landing after its event day completed is late: with ``late_records="dead_letter"``
  its record is a dead letter with reason ``late`` and the day is not reopened.
- The reporter sensor then materialises the three days in Dagster, once each, and the checks'
  runs it requests evaluate every check of each day.

Real Postgres, real local Spark, a real (ephemeral) Dagster instance.

No ``__init__.py`` in this folder on purpose (see test_definitions.py).
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections import Counter
from collections.abc import Callable
from datetime import UTC, date, datetime, timedelta
from datetime import time as clock_time
from typing import Any

import pyarrow.dataset as ds
import pytest
import sqlalchemy as sa
from conftest import TestSettings
from dagster import (
    AssetCheckKey,
    AssetSelection,
    DagsterInstance,
    DagsterRunStatus,
    RunRequest,
    RunsFilter,
    SensorResult,
    materialize,
)
from dagster_support import sensor_named, sensor_tick
from demo_platform import demo_pipeline, prepare_demo
from sluice_resource import resource_for

from dagster_project import pipeline_definitions
from dagster_project.continuous import SLUICE_RUN_TAG
from enumerator_service._completions import PartitionCompletion
from enumerator_service._operations import open_platform
from enumerator_service._schema import (
    checkpoints,
    partition_completions,
    partition_stats,
    run_watermarks,
    sink_transactions,
    splits,
)
from examples._clickstream_data import DemoSpec, generate_events

MakeSettings = Callable[..., TestSettings]
D1, D2, D3 = date(2026, 1, 1), date(2026, 1, 2), date(2026, 1, 3)
#: Events a day, two files: ~50 splits of 16 KiB, so both subtasks read every day.
EVENTS = 6000
UNFINISHED = ("UNASSIGNED", "ASSIGNED", "READING", "HELD")


def _end(day: date) -> datetime:
    return datetime.combine(day + timedelta(days=1), clock_time(), tzinfo=UTC)


class Observer(threading.Thread):
    """Polls the source's event-time state (one snapshot per read) while the run goes."""

    def __init__(self, engine: sa.Engine, source: str) -> None:
        super().__init__(daemon=True)
        self.engine, self.source = engine, source
        self.held: set[date] = set()
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            with self.engine.connect() as conn, conn.begin():
                conn.exec_driver_sql("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
                self._look(conn)
            time.sleep(0.02)

    def _look(self, conn: sa.Connection) -> None:
        mark = conn.execute(
            sa.select(sa.func.max(run_watermarks.c.watermark)).where(
                run_watermarks.c.source == self.source
            )
        ).scalar()
        if mark is None:
            return
        s, st, c = splits, partition_stats, partition_completions
        written = conn.execute(
            sa.select(st.c.partition_key).where(st.c.source == self.source, st.c.rows > 0)
        ).scalars()
        completed = set(
            conn.execute(sa.select(c.c.partition_key).where(c.c.source == self.source)).scalars()
        )
        for day in set(written) - completed:
            if mark < _end(day):
                continue
            unfinished = conn.execute(
                sa.select(sa.func.count()).where(
                    s.c.source == self.source, s.c.partition_key <= day, s.c.status.in_(UNFINISHED)
                )
            ).scalar_one()
            if unfinished:
                self.held.add(day)


def _wait(condition: Callable[[], bool], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.05)


def _committed_rows_at(conn: sa.Connection, run_id: str, day: date, checkpoint: int) -> int:
    """Rows of ``day`` that ``run_id``'s checkpoints up to ``checkpoint`` committed."""
    t = sink_transactions
    staged = conn.execute(
        sa.select(t.c.staged).where(
            t.c.run_id == run_id, t.c.committed, t.c.checkpoint_id <= checkpoint
        )
    ).scalars()
    return sum(
        int(entry["rows"])
        for entries in staged
        for entry in entries or []
        if f"/dt={day.isoformat()}/" in entry["final"]
    )


@pytest.mark.spark
def test_three_days_landing_out_of_order_complete_once_each_and_are_reported(
    make_settings: MakeSettings, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in {
        "SLUICE_CHECKPOINT_INTERVAL_SECONDS": "0.1",
        "SLUICE_CONTINUOUS_POLL_SECONDS": "0.2",
        "SLUICE_CONTINUOUS_IDLE_SECONDS": "5",
        # Several splits per file, read in small blocks: a day is read over checkpoints.
        "SLUICE_TARGET_SPLIT_BYTES": str(16 << 10),
        "SLUICE_READ_BLOCK_BYTES": str(4 << 10),
    }.items():
        monkeypatch.setenv(name, value)
    # The shipped default: the partitions are the days discovered (added by the reporter).
    settings = make_settings(demo_events=1200, demo_users=300, dagster_partitions="discovered")
    platform = open_platform(settings)
    observer = Observer(platform.engine, settings.source_name)
    try:
        prepare_demo(settings, platform, events=False)
        pipeline = demo_pipeline(settings)
        source = dataclasses.replace(pipeline.source, late_records="dead_letter")
        pipeline = dataclasses.replace(pipeline, source=source)
        built = pipeline_definitions(pipeline, settings)
        name, sluice = pipeline.name, resource_for(settings)
        continuous, reporter = (
            sensor_named(built, "continuous"),
            sensor_named(built, "report_completions"),
        )

        def land(day: date, seed: int) -> None:
            spec = DemoSpec(
                events=EVENTS, days=1, files_per_day=2, users=300, start_date=day, seed=seed
            )
            generate_events(settings.landing_path, spec)

        def split_states(day: date) -> Counter[str]:
            with platform.engine.connect() as conn:
                rows = conn.execute(
                    sa.select(splits.c.status).where(
                        splits.c.source == name, splits.c.partition_key == day
                    )
                ).scalars()
                return Counter(str(r) for r in rows)

        def read(day: date) -> bool:
            states = split_states(day)
            return bool(states) and set(states) <= {"COMPLETED"}

        def last_checkpoint(run_id: str) -> int:
            with platform.engine.connect() as conn:
                return int(
                    conn.execute(
                        sa.select(
                            sa.func.coalesce(sa.func.max(checkpoints.c.checkpoint_id), 0)
                        ).where(checkpoints.c.run_id == run_id, checkpoints.c.status == "COMPLETED")
                    ).scalar_one()
                )

        def run_mark() -> datetime:
            with platform.engine.connect() as conn:
                mark = conn.execute(
                    sa.select(run_watermarks.c.watermark).where(run_watermarks.c.source == name)
                ).scalar()
            return mark or datetime.min.replace(tzinfo=UTC)

        def completions() -> dict[tuple[date, int], PartitionCompletion]:
            with platform.engine.connect() as conn:
                rows = conn.execute(
                    sa.select(partition_completions).where(partition_completions.c.source == name)
                ).mappings()
                return {
                    (r["partition_key"], r["generation"]): PartitionCompletion(
                        **{k: r[k] for k in PartitionCompletion.__dataclass_fields__}
                    )
                    for r in rows
                }

        with DagsterInstance.ephemeral() as instance:
            land(D2, seed=2)
            request, cursor = sensor_tick(continuous, sluice, None, instance)
            assert isinstance(request, RunRequest), request
            fed: dict[str, Any] = {}

            def feed() -> None:
                """While the run is live, day 1 lands, then a late file of day 1 (once day 1
                is complete), then day 3; each time the next tick assigns the new files to the
                live run."""
                nonlocal cursor
                try:
                    mine = RunsFilter(tags={SLUICE_RUN_TAG: request.tags[SLUICE_RUN_TAG]})
                    _wait(
                        lambda: (
                            any(
                                r.status == DagsterRunStatus.STARTED
                                for r in instance.get_runs(mine)
                            )
                            and read(D2)
                            and run_mark() >= _end(D1)
                        )
                    )
                    # Day 1 lands after the run watermark passed it, in many splits: its first
                    # rows commit while others are still read (the split condition holds it).
                    land(D1, seed=1)
                    fed["D1"], cursor = sensor_tick(continuous, sluice, cursor, instance)
                    _wait(lambda: (D1, 1) in completions())
                    # Once the readers know day 1 is complete (they reload the completed days
                    # after each completed checkpoint), a file of day 1's events lands late.
                    after = completions()[D1, 1].checkpoint_id + 1
                    _wait(lambda: last_checkpoint(request.tags[SLUICE_RUN_TAG]) > after)
                    late = settings.landing_path / f"dt={D2}" / "late.jsonl"
                    late.write_text(
                        '{"event_id": "late-1", "user_id": 1, "event_time": '
                        '"2026-01-01T10:00:00+00:00", "event_type": "click", "amount": 0.0}\n'
                    )
                    fed["late"], cursor = sensor_tick(continuous, sluice, cursor, instance)
                    _wait(lambda: set(split_states(D2)) <= {"COMPLETED"})
                    land(D3, seed=3)
                    fed["D3"], cursor = sensor_tick(continuous, sluice, cursor, instance)
                except BaseException as exc:  # shown by the test
                    fed["error"] = exc
                    with platform.engine.connect() as conn:
                        fed["debug"] = [
                            conn.execute(sa.select(t).where(t.c.source == name)).all()
                            for t in (run_watermarks, partition_stats, partition_completions)
                        ]
                    fed["splits"] = {d: split_states(d) for d in (D1, D2, D3)}

            observer.start()
            feeder = threading.Thread(target=feed)
            feeder.start()
            started = time.monotonic()
            try:
                result = built.continuous_job.execute_in_process(
                    tags=request.tags, resources={"sluice": sluice}, instance=instance
                )
            finally:
                feeder.join(timeout=120)
                observer.stop.set()
                observer.join(timeout=10)
            assert "error" not in fed, (fed["error"], fed.get("debug"), fed.get("splits"))
            assert result.success
            assert time.monotonic() - started < 60
            run_id = request.tags[SLUICE_RUN_TAG]

            # Each day complete exactly once (the late record reopened nothing), by this run.
            done = completions()
            assert sorted(done) == [(D1, 1), (D2, 1), (D3, 1)]
            assert {c.run_id for c in done.values()} == {run_id}
            # Only after its last in-time record was committed: at the completion's checkpoint
            # the day's committed rows are all of its output rows.
            output = ds.dataset(settings.output_path, format="parquet", partitioning="hive")
            table = output.to_table(columns=["event_id", "dt"])
            per_day = Counter(str(d) for d in table.column("dt").to_pylist())
            assert "late-1" not in table.column("event_id").to_pylist()
            with platform.engine.connect() as conn:
                for (day, _), completion in done.items():
                    at = _committed_rows_at(conn, run_id, day, completion.checkpoint_id)
                    assert at == completion.rows == per_day[day.isoformat()] > 0, day
                reasons = conn.execute(
                    sa.text("SELECT reason FROM sluice.dead_letters WHERE source = :s"),
                    {"s": name},
                ).scalars()
                late_split = conn.execute(
                    sa.select(splits.c.status, splits.c.run_id).where(
                        splits.c.source == name, splits.c.uri.like("%late.jsonl")
                    )
                ).all()
                assert Counter(reasons)["late"] == 1, (Counter(reasons), late_split, fed, done)
            # The split condition held a day back that the run watermark alone had passed.
            assert observer.held & {D1, D2}, observer.held

            # The reporter: every day materialised once, and its checks ran.
            reported, _ = sensor_tick(reporter, sluice, None, instance)
            assert isinstance(reported, SensorResult)
            days = {d.isoformat() for d in (D1, D2, D3)}
            assert instance.get_materialized_partitions(built.output.key) == days
            for run_request in reported.run_requests or []:
                checks = materialize(
                    [built.output, *built.checks],
                    selection=AssetSelection.checks(*(run_request.asset_check_keys or [])),
                    tags=run_request.tags,
                    resources={"sluice": sluice},
                    instance=instance,
                )
                assert checks.success
            again, _ = sensor_tick(reporter, sluice, None, instance)
            assert not isinstance(again, SensorResult)
            for check in built.checks:
                for key in check.check_keys:
                    history = instance.event_log_storage.get_asset_check_execution_history(
                        AssetCheckKey(built.output.key, key.name), limit=20
                    )
                    assert sorted(str(h.partition) for h in history) == sorted(days), key
    finally:
        observer.stop.set()
        platform.close()
