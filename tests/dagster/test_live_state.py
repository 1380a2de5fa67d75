"""The live state of a pipeline (``sluice status`` and the ``<pipeline>_live_state``
sensor): watermark and its lag, backlog, the oldest unprocessed split's age, rows/s, the last
checkpoint's duration; partial days; the ``watermark_freshness`` check. Real Postgres (rows
of a run inserted as its checkpoints commit them), real Dagster instance and sensor context,
a virtual clock.

No ``__init__.py`` in this folder on purpose (see test_definitions.py).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Iterator
from datetime import UTC, date, datetime, timedelta
from typing import Any

import pytest
import sqlalchemy as sa
from completions_support import create_completions_table, insert_completion
from conftest import TestSettings
from dagster import (
    AssetCheckKey,
    AssetRecordsFilter,
    DagsterInstance,
    SkipReason,
    build_sensor_context,
)
from dagster_support import demo_definitions
from rich.console import Console
from sluice_resource import resource_for

from dagster_project import PipelineDefinitions
from dagster_project.live import FRESHNESS_CHECK, live_state_sensor
from enumerator_service import FileSplit, SplitStore
from enumerator_service._completeness import END_OF_INPUT, NO_WATERMARK, record_run_watermark
from enumerator_service._completions import CompletionCounts, completion_counts
from enumerator_service._live_state import live_state
from enumerator_service._operations import Platform, open_platform, platform_status
from enumerator_service._schema import checkpoints, sink_transactions, splits
from spark_jobs.cli._render import status_json, status_table

MakeSettings = Callable[..., TestSettings]
T0 = datetime(2026, 1, 3, 12, 0, tzinfo=UTC)
DAYS = [date(2026, 1, 1), date(2026, 1, 2), date(2026, 1, 3)]


class Pipeline:
    """A run of the test's pipeline, written as its checkpoints would commit it."""

    def __init__(self, settings: TestSettings, platform: Platform) -> None:
        self.settings, self.platform = settings, platform
        self.built: PipelineDefinitions = demo_definitions(settings)
        self.source = self.built.pipeline.name
        self.store = SplitStore(platform.engine)
        #: Run ids are global to the database the tests share.
        self.run = f"{self.source}-r1"

    def register(self, day: date, files: int) -> None:
        folder = self.settings.landing_path / f"dt={day}"
        self.store.register(
            [
                FileSplit(self.source, "jsonl", str(folder / f"{i}.jsonl"), 0, None, day)
                for i in range(files)
            ]
        )
        with self.platform.engine.begin() as conn:
            conn.execute(
                splits.update()
                .where(splits.c.source == self.source, splits.c.partition_key == day)
                .values(registered_at=datetime.combine(day, datetime.min.time(), tzinfo=UTC))
            )

    def checkpoint(
        self, run: str, cid: int, triggered: datetime, took: float, rows: int, day: date = DAYS[1]
    ) -> None:
        """Checkpoint ``cid`` of ``run`` completed, its sink committed ``rows`` rows of ``day``
        (one Parquet file)."""
        root = self.settings.output_path
        name = f"part-{run}-{cid}.parquet"
        staged = [
            {"staged": f"{root}/_staging/{name}", "final": f"{root}/dt={day}/{name}", "rows": rows}
        ]
        with self.platform.engine.begin() as conn:
            conn.execute(
                checkpoints.insert().values(
                    run_id=run,
                    checkpoint_id=cid,
                    source=self.source,
                    status="COMPLETED",
                    triggered_at=triggered,
                    completed_at=triggered + timedelta(seconds=took),
                )
            )
            conn.execute(
                sink_transactions.insert().values(
                    run_id=run,
                    source=self.source,
                    subtask=0,
                    attempt="a",
                    checkpoint_id=cid,
                    sink="parquet",
                    staged=staged,
                    row_count=rows,
                    dead_letters=[],
                    # Published, as after the checkpoint: run recovery (of every source)
                    # publishes committed transactions that are not.
                    committed=True,
                    committed_at=triggered + timedelta(seconds=took),
                    published=True,
                    published_at=triggered + timedelta(seconds=took),
                )
            )

    def run_watermark(self, run: str, cid: int, watermark: datetime) -> None:
        """Checkpoint ``cid`` of ``run`` recorded its run watermark (END_OF_INPUT: finished)."""
        with self.platform.engine.begin() as conn:
            record_run_watermark(conn, run, self.source, cid, watermark)

    def read(self, run: str, day: date, watermark: datetime, *, finished: bool) -> None:
        """The run holds (or finished) ``day``'s splits, committed up to ``watermark``."""
        with self.platform.engine.begin() as conn:
            conn.execute(
                splits.update()
                .where(splits.c.source == self.source, splits.c.partition_key == day)
                .values(
                    run_id=run,
                    status="COMPLETED" if finished else "READING",
                    committed_watermark=watermark,
                )
            )


@pytest.fixture
def pipeline(make_settings: MakeSettings) -> Iterator[Pipeline]:
    settings = make_settings()
    platform = open_platform(settings)
    try:
        yield Pipeline(settings, platform)
    finally:
        platform.close()


def test_live_state_at_the_latest_completed_checkpoint(pipeline: Pipeline) -> None:
    with pipeline.platform.engine.connect() as conn:
        empty = live_state(conn, pipeline.source, T0)
    assert empty.run_id is None and empty.watermark is None and empty.backlog_splits == 0

    for day in DAYS:
        pipeline.register(day, files=2)
    pipeline.read(pipeline.run, DAYS[0], T0 - timedelta(days=1), finished=True)
    pipeline.read(pipeline.run, DAYS[1], T0 - timedelta(hours=2), finished=False)
    pipeline.checkpoint(pipeline.run, 1, T0 - timedelta(seconds=70), took=2.0, rows=1000)
    with pipeline.platform.engine.connect() as conn:
        # Checkpoint 1 recorded no run watermark (a subtask had none yet).
        assert live_state(conn, pipeline.source, T0).watermark is None
    pipeline.run_watermark(pipeline.run, 1, NO_WATERMARK)
    with pipeline.platform.engine.connect() as conn:
        assert live_state(conn, pipeline.source, T0).watermark is None
    pipeline.checkpoint(pipeline.run, 2, T0 - timedelta(seconds=20), took=4.0, rows=3000)
    pipeline.run_watermark(pipeline.run, 2, T0 - timedelta(hours=2))
    # The splits' committed watermarks are not the run's: its row in run_watermarks is.
    pipeline.read(pipeline.run, DAYS[1], T0 - timedelta(hours=5), finished=False)
    with pipeline.platform.engine.connect() as conn:
        state = live_state(conn, pipeline.source, T0)
    assert (state.run_id, state.checkpoint_id) == (pipeline.run, 2)
    assert state.last_checkpoint_seconds == 4.0
    # The run's last minute: checkpoints 1 and 2 (4000 rows) since its first trigger (no
    # split of it records when it was taken: the test wrote them without).
    assert state.rows_per_second == pytest.approx(4000 / 54)
    # The run watermark recorded by checkpoint 2.
    assert state.watermark == T0 - timedelta(hours=2)
    assert state.watermark_lag_seconds == 7200.0
    # Days 2 and 3 are still to do; day 2's files were registered first.
    assert state.backlog_splits == 4
    assert (
        state.oldest_unprocessed_age_seconds
        == (T0 - datetime(2026, 1, 2, tzinfo=UTC)).total_seconds()
    )

    status = platform_status(pipeline.platform, pipeline.source, now=T0)
    # (The tests share a database: another test may have created the completions table.)
    assert status.completions in (None, CompletionCounts(0, 0, 0))
    with pipeline.platform.engine.connect() as conn, conn.begin() as transaction:
        # Before migration 0008 there is no table: nothing to count (DDL rolls back).
        conn.execute(sa.text("DROP TABLE IF EXISTS sluice.partition_completions"))
        assert completion_counts(conn, pipeline.source) is None
        transaction.rollback()
    live = status_json([status])["pipelines"][pipeline.source]["live"]
    assert live["watermark"] == (T0 - timedelta(hours=2)).isoformat()
    assert live["watermark_lag_seconds"] == 7200.0
    assert live["backlog_splits"] == 4 and live["last_checkpoint_seconds"] == 4.0
    json.dumps(live)  # plain values
    console = Console(record=True, width=200)
    console.print(status_table(status))
    text = console.export_text()
    assert "2026-01-03 10:00:00 (lag 2h 00m)" in text
    assert "4 splits, oldest waiting 36h 00m" in text
    assert "74.1 rows/s committed (last minute); last checkpoint took 4.0s" in text

    # A run watermark never moves backwards; once every input ended it is +infinity, lag 0.
    pipeline.run_watermark(pipeline.run, 2, T0 - timedelta(hours=9))
    with pipeline.platform.engine.connect() as conn:
        assert live_state(conn, pipeline.source, T0).watermark == T0 - timedelta(hours=2)
    pipeline.run_watermark(pipeline.run, 2, END_OF_INPUT)
    with pipeline.platform.engine.connect() as conn:
        done = live_state(conn, pipeline.source, T0)
    assert done.watermark == END_OF_INPUT and done.watermark_lag_seconds == 0.0
    console = Console(record=True, width=200)
    console.print(status_table(platform_status(pipeline.platform, pipeline.source, now=T0)))
    assert "end of input (every split read)" in console.export_text()


class Clock:
    def __init__(self, now: datetime) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now


def _tick(
    pipeline: Pipeline, clock: Clock, instance: DagsterInstance, cursor: str | None
) -> tuple[str, str | None]:
    partitioned = pipeline.built.partitions is not None
    sensor = live_state_sensor(
        pipeline.built.pipeline, pipeline.built.output.key, partitioned, clock
    )
    with build_sensor_context(
        instance=instance,
        cursor=cursor,
        resources={"sluice": resource_for(pipeline.settings, max_watermark_lag_seconds=None)},
    ) as context:
        result = sensor(context)
        assert isinstance(result, SkipReason)
        return result.skip_message or "", context.cursor


def _freshness(instance: DagsterInstance, pipeline: Pipeline) -> list[Any]:
    return list(
        instance.event_log_storage.get_asset_check_execution_history(
            AssetCheckKey(pipeline.built.output.key, FRESHNESS_CHECK), limit=100
        )
    )


def test_rows_per_second_is_the_runs_last_minute(pipeline: Pipeline) -> None:
    """A run of one checkpoint: its rows over the run's time since it took its first split
    (was over the checkpoint's own 0.05 s: 176,010 rows/s for a run of 2,205 rows/s); a
    longer run: the rows of its last minute, over the time since the completion before it."""
    pipeline.register(DAYS[0], files=2)
    run = f"{pipeline.source}-rate"
    with pipeline.platform.engine.begin() as conn:
        conn.execute(
            splits.update()
            .where(splits.c.source == pipeline.source, splits.c.partition_key == DAYS[0])
            .values(run_id=run, status="COMPLETED", assigned_at=T0 - timedelta(seconds=10))
        )
    pipeline.checkpoint(run, 1, T0 - timedelta(seconds=0.05), took=0.05, rows=22_050)
    with pipeline.platform.engine.connect() as conn:
        assert live_state(conn, pipeline.source, T0).rows_per_second == pytest.approx(2_205)
    # Nine more, completed every 10 s up to T0 + 90 s: the last minute holds checkpoints
    # 5..10 (T0 + 40..90 s), counted from checkpoint 4's completion (T0 + 30 s).
    for cid in range(2, 11):
        pipeline.checkpoint(
            run, cid, T0 + timedelta(seconds=10 * (cid - 1) - 1), 1.0, rows=100 * cid
        )
    with pipeline.platform.engine.connect() as conn:
        state = live_state(conn, pipeline.source, T0 + timedelta(seconds=100))
    assert state.checkpoint_id == 10
    assert state.rows_per_second == pytest.approx(100 * sum(range(5, 11)) / 60)


def test_the_sensor_observes_each_checkpoint_and_the_partial_days(
    pipeline: Pipeline, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SLUICE_MAX_WATERMARK_LAG_SECONDS", "10800")  # 3 hours
    create_completions_table(pipeline.platform.engine)
    clock = Clock(T0)
    for day in DAYS:
        pipeline.register(day, files=1)
    pipeline.read(pipeline.run, DAYS[0], T0 - timedelta(days=1), finished=True)
    pipeline.read(pipeline.run, DAYS[1], T0 - timedelta(hours=2), finished=False)
    pipeline.checkpoint(pipeline.run, 1, T0 - timedelta(seconds=30), took=1.0, rows=10)
    pipeline.run_watermark(pipeline.run, 1, T0 - timedelta(hours=2))
    insert_completion(pipeline.platform.engine, pipeline.source, DAYS[0])
    key = pipeline.built.output.key
    with DagsterInstance.ephemeral() as instance:
        message, cursor = _tick(pipeline, clock, instance, None)
        observed = f"checkpoint {pipeline.run}/1 observed (2 days in progress)"
        assert message == f"{observed}; {FRESHNESS_CHECK} passed"
        observations = instance.fetch_observations(
            AssetRecordsFilter(asset_key=key), limit=10
        ).records
        by_partition = {r.partition_key: r.asset_observation for r in observations}
        assert set(by_partition) == {None, "2026-01-02", "2026-01-03"}  # day 1 is complete
        whole = {k: v.value for k, v in by_partition[None].metadata.items()}
        assert whole["watermark_lag_seconds"] == 7200.0 and whole["backlog_splits"] == 2
        day2 = {k: v.value for k, v in by_partition["2026-01-02"].metadata.items()}
        assert day2["splits"] == 1 and day2["splits_completed"] == 0
        assert day2["rows_so_far"] == 10

        # Nothing new: nothing reported again.
        assert _tick(pipeline, clock, instance, cursor)[0] == "no new checkpoint"
        assert (
            len(instance.fetch_observations(AssetRecordsFilter(asset_key=key), limit=10).records)
            == 3
        )
        # The pipeline stalls: an hour later the watermark is 3 hours behind, then more.
        clock.now = T0 + timedelta(hours=1, seconds=1)
        message, cursor = _tick(pipeline, clock, instance, cursor)
        assert message == f"{FRESHNESS_CHECK} failed"
        latest = _freshness(instance, pipeline)[0]
        assert latest.status.value == "FAILED"
        assert "over SLUICE_MAX_WATERMARK_LAG_SECONDS=10800" in (
            latest.event.dagster_event.event_specific_data.description
        )
        clock.now += timedelta(hours=1)
        assert _tick(pipeline, clock, instance, cursor)[0] == "no new checkpoint"
        assert len(_freshness(instance, pipeline)) == 2  # an event per change only


def test_a_stale_watermark_with_nothing_waiting_says_where_to_look() -> None:
    """Behind with no input registered: a stopped run or schedule, or a quiet source; behind
    with a backlog: the pipeline is not keeping up (no hint needed)."""
    from dagster_project.live import freshness_outcome
    from enumerator_service import LiveState

    def state(backlog: int) -> LiveState:
        watermark = T0 - timedelta(hours=2)
        return LiveState("p", T0, "r", 3, T0, 0.1, watermark, backlog, None, None)

    quiet = freshness_outcome(state(0), 3600.0)
    assert not quiet.passed and "nothing registered is waiting" in (quiet.description or "")
    behind = freshness_outcome(state(2), 3600.0)
    assert not behind.passed and "nothing registered" not in (behind.description or "")
    assert freshness_outcome(state(0), 10_000.0).passed
    ended = dataclasses.replace(state(0), watermark=END_OF_INPUT)
    shown = freshness_outcome(ended, 60.0)
    assert shown.passed and shown.metadata["watermark"].value == "end of input (every split read)"


def test_a_watermark_ahead_of_the_clock_is_a_warning() -> None:
    """An event time from the future pins the watermark ahead of now: past the bound the check
    fails as a warning saying so (a stalled pipeline behind it passed as fresh); within the
    bound (clock skew, a source ahead by seconds) it passes."""
    from dagster import AssetCheckSeverity

    from dagster_project.live import freshness_outcome
    from enumerator_service import LiveState

    def ahead_by(seconds: float) -> LiveState:
        return LiveState("p", T0, "r", 3, T0, 0.1, T0 + timedelta(seconds=seconds), 0, None, None)

    future = freshness_outcome(ahead_by(3 * 86_400), 3600.0)
    assert not future.passed and future.severity == AssetCheckSeverity.WARN
    assert "259,200s ahead of the clock" in (future.description or "")
    near = freshness_outcome(ahead_by(30), 3600.0)
    assert near.passed and near.severity == AssetCheckSeverity.ERROR  # (the default)
