"""The continuous sensor decides whether its STARTED run is alive by the run's lease heartbeat
in Postgres, not by Dagster's run status: real Dagster instance and sensor contexts, real
Postgres, the driver's real ``Heartbeat`` thread.

No ``__init__.py`` in this folder on purpose (see test_definitions.py).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest
from conftest import TestSettings
from dagster import (
    DagsterEvent,
    DagsterEventType,
    DagsterInstance,
    DagsterRun,
    DagsterRunStatus,
    RunRequest,
    SkipReason,
)
from dagster_support import demo_definitions, sensor_named, sensor_tick
from sluice_resource import resource_for

from dagster_project import PipelineDefinitions
from dagster_project._runs import PIPELINE_TAG
from dagster_project.continuous import GENERATION_TAG, MODE_TAG, REPLACES_TAG, SLUICE_RUN_TAG
from enumerator_service import SplitStore, connect_engine
from examples._clickstream_data import DemoSpec, generate_events
from spark_jobs.jobs._heartbeat import Heartbeat

MakeSettings = Callable[..., TestSettings]
RUN_TAGS = (MODE_TAG, PIPELINE_TAG, GENERATION_TAG, SLUICE_RUN_TAG)
#: Short enough for a fast test, long enough for a tick to land inside a fresh run's grace.
LEASE = 3.0


def _tick(
    built: PipelineDefinitions, instance: DagsterInstance, settings: TestSettings, cursor: Any
) -> tuple[Any, Any]:
    return sensor_tick(sensor_named(built, "continuous"), resource_for(settings), cursor, instance)


def _start_run(
    instance: DagsterInstance, built: PipelineDefinitions, request: RunRequest, *, step: bool
) -> DagsterRun:
    """The requested run, STARTED the way a run worker starts it (a RUN_START event: the run
    record gets its start time); ``step``: its reader step started too."""
    run = instance.add_run(
        DagsterRun(
            job_name=built.continuous_job.name,
            status=DagsterRunStatus.STARTING,
            tags={key: request.tags[key] for key in RUN_TAGS},
        )
    )
    event = DagsterEvent(DagsterEventType.RUN_START.value, job_name=run.job_name)
    instance.report_dagster_event(event, run_id=run.run_id)
    if step:
        _start_step(instance, run)
    started = instance.get_run_by_id(run.run_id)
    assert started is not None and started.status == DagsterRunStatus.STARTED
    return started


def _start_step(instance: DagsterInstance, run: DagsterRun) -> None:
    event = DagsterEvent(
        DagsterEventType.STEP_START.value,
        job_name=run.job_name,
        step_key=f"{run.job_name}_reader",
    )
    instance.report_dagster_event(event, run_id=run.run_id)


def _land(settings: TestSettings, name: str) -> None:
    folder = settings.landing_path / "dt=2026-01-09"
    folder.mkdir(exist_ok=True)
    (folder / f"{name}.jsonl").write_text(
        f'{{"event_id": "{name}", "user_id": 1, "event_time": "2026-01-09T00:00:00+00:00", '
        '"event_type": "click", "amount": 1.0}\n'
    )


def _owners(store: SplitStore, source: str) -> dict[str | None, int]:
    with store._engine.connect() as conn:
        rows = conn.exec_driver_sql(
            "SELECT run_id, count(*) FROM sluice.splits WHERE source = %s AND status IN "
            "('ASSIGNED', 'READING') GROUP BY run_id",
            (source,),
        )
        return {row[0]: int(row[1]) for row in rows}


def test_a_started_run_whose_heartbeat_stopped_is_reported_dead_and_replaced(
    make_settings: MakeSettings, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The sensor's resource reads the settings it has no field for from SLUICE_*.
    monkeypatch.setenv("SLUICE_LEASE_SECONDS", str(LEASE))
    settings = make_settings(demo_events=60, demo_users=20, lease_seconds=LEASE)
    generate_events(settings.landing_path, DemoSpec.from_settings(settings))
    built, source = demo_definitions(settings), settings.source_name
    assert settings.database_url is not None
    engine = connect_engine(settings.database_url.get_secret_value())
    store = SplitStore(engine)
    files = settings.demo_days * settings.demo_files_per_day
    try:
        with DagsterInstance.ephemeral() as instance:
            request, cursor = _tick(built, instance, settings, None)
            assert isinstance(request, RunRequest)
            first = request.tags[SLUICE_RUN_TAG]
            # It waited in the queue for longer than its leases, and its step takes longer
            # than a lease to start (a busy machine): leases expired, yet alive, and fed.
            time.sleep(LEASE + 0.5)
            assert store.expired_leases(first) == files
            run = _start_run(instance, built, request, step=False)
            time.sleep(LEASE + 0.5)
            _land(settings, "queued")
            fed, cursor = _tick(built, instance, settings, cursor)
            assert isinstance(fed, SkipReason), fed
            assert "1 assigned to the live continuous run" in (fed.skip_message or "")
            # Its step starts (the op renews the leases from here on): alive, fed.
            _start_step(instance, run)
            _land(settings, "step")
            fed, cursor = _tick(built, instance, settings, cursor)
            assert isinstance(fed, SkipReason), fed
            assert "1 assigned to the live continuous run" in (fed.skip_message or "")
            # Its driver's heartbeat renews the leases: still alive one lease later, and fed.
            heartbeat = Heartbeat(store, engine, first, LEASE, None)
            heartbeat.start()
            try:
                time.sleep(LEASE + 0.5)
                _land(settings, "live")
                fed, cursor = _tick(built, instance, settings, cursor)
                assert isinstance(fed, SkipReason), fed
                assert "1 assigned to the live continuous run" in (fed.skip_message or "")
                assert _owners(store, source) == {first: files + 3}
            finally:
                heartbeat.stop()
            # The run worker dies (its heartbeat with it); Dagster still says STARTED.
            time.sleep(LEASE + 0.5)
            still = instance.get_run_by_id(run.run_id)
            assert still is not None and still.status == DagsterRunStatus.STARTED
            _land(settings, "after-death")
            successor, cursor = _tick(built, instance, settings, cursor)
            assert isinstance(successor, RunRequest), successor
            # Reported failed with the reason; nothing is left assigned to it.
            dead = instance.get_run_by_id(run.run_id)
            assert dead is not None and dead.status == DagsterRunStatus.FAILURE
            (failure,) = instance.all_logs(run.run_id, of_type=DagsterEventType.RUN_FAILURE)
            assert "lease heartbeat stopped" in (failure.message or "")
            assert successor.tags[REPLACES_TAG] == run.run_id
            assert successor.tags[GENERATION_TAG] == "2"
            second = successor.tags[SLUICE_RUN_TAG]
            assert second != first
            # Its splits (and the new file's) went to the successor, none stayed with it.
            assert _owners(store, source) == {second: files + 4}
            assert store.expired_leases(second) == 0
            # Exactly one successor: the next tick waits for it.
            after, _ = _tick(built, instance, settings, cursor)
            assert isinstance(after, SkipReason)
            assert "waiting for continuous run generation 2" in (after.skip_message or "")
    finally:
        engine.dispose()


def test_a_live_run_holding_no_split_keeps_getting_splits(
    make_settings: MakeSettings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No split held, so no lease to judge by: the run is fed (and the lease of what it is fed
    is what finds it dead later)."""
    monkeypatch.setenv("SLUICE_LEASE_SECONDS", "1")
    settings = make_settings(demo_events=30, demo_users=10, lease_seconds=1.0)
    generate_events(settings.landing_path, DemoSpec.from_settings(settings))
    built, source = demo_definitions(settings), settings.source_name
    assert settings.database_url is not None
    engine = connect_engine(settings.database_url.get_secret_value())
    store = SplitStore(engine)
    try:
        with DagsterInstance.ephemeral() as instance:
            request, cursor = _tick(built, instance, settings, None)
            assert isinstance(request, RunRequest)
            run = _start_run(instance, built, request, step=True)
            # It read everything it was given.
            with engine.begin() as conn:
                conn.exec_driver_sql(
                    "UPDATE sluice.splits SET status = 'COMPLETED' WHERE source = %s", (source,)
                )
            time.sleep(1.5)
            _land(settings, "idle")
            fed, _ = _tick(built, instance, settings, cursor)
            assert isinstance(fed, SkipReason), fed
            assert "1 assigned to the live continuous run" in (fed.skip_message or "")
            live = instance.get_run_by_id(run.run_id)
            assert live is not None and live.status == DagsterRunStatus.STARTED
            assert _owners(store, source) == {request.tags[SLUICE_RUN_TAG]: 1}
    finally:
        engine.dispose()
