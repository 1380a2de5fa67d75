"""Sensor-driven continuous mode and failed runs, with real Dagster contexts and Postgres."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow.dataset as ds
import pytest
from dagster import (
    DagsterEventType,
    DagsterInstance,
    DagsterRun,
    DagsterRunStatus,
    RunRequest,
    SkipReason,
    build_run_status_sensor_context,
    build_sensor_context,
    job,
    op,
)
from enumerator_service._demo_data import DemoSpec, generate_events, load_users
from sluice_resource import resource_for

from dagster_project.continuous import (
    GENERATION_TAG,
    MODE_TAG,
    SLUICE_RUN_TAG,
    SOURCE_TAG,
    continuous_reader_job,
    continuous_reader_sensor,
    release_failed_run_splits,
)
from enumerator_service import Settings, SplitStore, asyncpg_dsn, connect_engine
from enumerator_service._operations import discover, open_platform

MakeSettings = Callable[..., Settings]


def _tick(instance: DagsterInstance, settings: Settings, cursor: str | None) -> tuple[Any, Any]:
    with build_sensor_context(
        instance=instance, cursor=cursor, resources={"sluice": resource_for(settings)}
    ) as context:
        return continuous_reader_sensor(context), context.cursor


def _store(settings: Settings) -> SplitStore:
    assert settings.database_url is not None
    return SplitStore(connect_engine(settings.database_url.get_secret_value()))


def _add_run(instance: DagsterInstance, tags: dict[str, str], status: DagsterRunStatus) -> None:
    instance.add_run(DagsterRun(job_name=continuous_reader_job.name, status=status, tags=tags))


def _small_data(settings: Settings) -> None:
    spec = DemoSpec.from_settings(settings)
    generate_events(settings.landing_path, spec)


def test_sensor_keeps_exactly_one_continuous_run_alive(make_settings: MakeSettings) -> None:
    settings = make_settings(demo_events=120, demo_users=50)
    _small_data(settings)
    store = _store(settings)
    files = settings.demo_days * settings.demo_files_per_day
    with DagsterInstance.ephemeral() as instance:
        # New files: registered, and one run requested (their splits reserved for it).
        first, cursor = _tick(instance, settings, None)
        assert isinstance(first, RunRequest)
        assert first.tags[GENERATION_TAG] == "1" and first.tags[MODE_TAG] == "continuous"
        run_id = first.tags[SLUICE_RUN_TAG]
        assert store.counts(settings.source_name) == {"ASSIGNED": files}
        # Nothing new (and the requested run not created yet): skip, never a second request.
        second, cursor = _tick(instance, settings, cursor)
        assert isinstance(second, SkipReason)
        assert "generation 1" in (second.skip_message or "")
        # The run is live: a new file's split goes to it, no request.
        tags = {k: first.tags[k] for k in (MODE_TAG, SOURCE_TAG, GENERATION_TAG, SLUICE_RUN_TAG)}
        _add_run(instance, tags, DagsterRunStatus.STARTED)
        folder = settings.landing_path / "dt=2026-01-09"
        folder.mkdir()
        (folder / "late.jsonl").write_text(
            '{"event_id": "late-1", "user_id": 1, "event_time": "2026-01-09T00:00:00+00:00", '
            '"event_type": "click", "amount": 1.0}\n'
        )
        third, cursor = _tick(instance, settings, cursor)
        assert isinstance(third, SkipReason)
        assert "1 assigned to the live continuous run" in (third.skip_message or "")
        assert store.counts(settings.source_name) == {"ASSIGNED": files + 1}
        with store._engine.connect() as conn:
            owners = {
                r[0]
                for r in conn.exec_driver_sql(
                    "SELECT DISTINCT run_id FROM sluice.splits WHERE source = %s",
                    (settings.source_name,),
                )
            }
        assert owners == {run_id}


def test_a_dead_continuous_run_gets_exactly_one_successor(make_settings: MakeSettings) -> None:
    settings = make_settings(demo_events=60, demo_users=20)
    _small_data(settings)
    with DagsterInstance.ephemeral() as instance:
        first, cursor = _tick(instance, settings, None)
        assert isinstance(first, RunRequest)
        tags = {k: first.tags[k] for k in (MODE_TAG, SOURCE_TAG, GENERATION_TAG, SLUICE_RUN_TAG)}
        _add_run(instance, tags, DagsterRunStatus.FAILURE)
        # No new files, but the continuous run died: exactly one new generation.
        again, cursor = _tick(instance, settings, cursor)
        assert isinstance(again, RunRequest)
        assert again.tags[GENERATION_TAG] == "2"
        assert again.run_key != first.run_key
        assert again.tags[SLUICE_RUN_TAG] != first.tags[SLUICE_RUN_TAG]
        third, _ = _tick(instance, settings, cursor)
        assert isinstance(third, SkipReason)  # the successor is requested, not yet running


@pytest.mark.spark
def test_a_failed_runs_splits_are_reassigned_and_finished(make_settings: MakeSettings) -> None:
    settings = make_settings(demo_events=300, demo_users=100)
    platform = open_platform(settings)
    try:
        _small_data(settings)
        load_users(
            asyncpg_dsn(platform.url), schema="public", table="users", key="id", users=100, seed=7
        )
        registered = discover(platform).splits_registered
        store = SplitStore(platform.engine)

        @op
        def boom() -> None:
            raise RuntimeError("the reader run died")

        @job(tags={SLUICE_RUN_TAG: "run-that-fails"})
        def failing() -> None:
            boom()

        # The run took the splits (one of them is being read) and then failed.
        store.assign_to_run("run-that-fails", settings.source_name, lease_seconds=3600)
        assert store.pull_next("run-that-fails", 0, 3600) is not None
        with DagsterInstance.ephemeral() as instance:
            result = failing.execute_in_process(instance=instance, raise_on_error=False)
            assert not result.success
            (record,) = instance.all_logs(result.run_id, of_type=DagsterEventType.RUN_FAILURE)
            event = record.get_dagster_event()
            run = instance.get_run_by_id(result.run_id)
            assert run is not None
            # Opened as a context manager: SluiceResource has nested resources.
            with build_run_status_sensor_context(
                sensor_name=release_failed_run_splits.name,
                dagster_event=event,
                dagster_instance=instance,
                dagster_run=run,
                resources={"sluice": resource_for(settings)},
            ) as context:
                release_failed_run_splits(context.for_run_failure())
        # Long leases notwithstanding, the splits are back in the pool; the next run takes them.
        assert store.counts(settings.source_name) == {"UNASSIGNED": registered}
        from spark_jobs.jobs import run_enrichment

        summary = run_enrichment(settings)
        assert summary.splits == registered
        assert store.counts(settings.source_name) == {"COMPLETED": registered}
    finally:
        platform.close()


@pytest.mark.spark
def test_a_continuous_run_pulls_splits_registered_while_it_runs(
    make_settings: MakeSettings, tmp_path: Path
) -> None:
    settings = make_settings(
        demo_events=400,
        demo_users=100,
        demo_days=1,
        checkpoint_interval_seconds=0.5,
        continuous_poll_seconds=0.2,
        continuous_idle_seconds=4.0,
    )
    platform = open_platform(settings)
    try:
        load_users(
            asyncpg_dsn(platform.url), schema="public", table="users", key="id", users=100, seed=7
        )
        _small_data(settings)
        discover(platform)
        from spark_jobs.jobs import run_enrichment

        outcome: dict[str, Any] = {}
        reader = threading.Thread(
            target=lambda: outcome.update(
                summary=run_enrichment(settings, run_id="continuous-test", continuous=True)
            )
        )
        reader.start()
        store = SplitStore(platform.engine)
        _wait(lambda: store.counts(settings.source_name).get("COMPLETED", 0) > 0)
        # New files arrive while the run is live; the sensor's part: register + assign.
        folder = settings.landing_path / "dt=2026-01-07"
        folder.mkdir()
        (folder / "new.jsonl").write_text(
            "".join(
                f'{{"event_id": "n-{i}", "user_id": {i + 1}, '
                f'"event_time": "2026-01-07T00:00:0{i}+00:00", "event_type": "click", '
                f'"amount": 1.0}}\n'
                for i in range(5)
            )
        )
        assert discover(platform).splits_registered == 1
        assert store.assign_to_run("continuous-test", settings.source_name, lease_seconds=60) == 1
        reader.join(timeout=120)
        assert not reader.is_alive(), "the continuous run did not end after idling"
        summary = outcome["summary"]
        rows = ds.dataset(settings.output_path, format="parquet").to_table().to_pylist()
        ids = [r["event_id"] for r in rows]
        assert len(ids) == len(set(ids)) == summary.rows_out
        assert {f"n-{i}" for i in range(5)} <= set(ids)
        assert set(store.counts(settings.source_name)) == {"COMPLETED"}
    finally:
        platform.close()


def _wait(condition: Callable[[], bool], timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.1)
