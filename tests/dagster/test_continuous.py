"""Sensor-driven continuous mode and failed runs of a pipeline, with real Dagster contexts,
real Postgres and (for the runs) real local Spark.

No ``__init__.py`` in this folder on purpose (see test_definitions.py).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow.dataset as ds
import pytest
from conftest import TestSettings
from dagster import (
    DagsterEventType,
    DagsterInstance,
    DagsterRun,
    DagsterRunStatus,
    RunRequest,
    RunsFilter,
    SkipReason,
    build_run_status_sensor_context,
    job,
    op,
)
from dagster_support import demo_definitions, sensor_named, sensor_tick, split_counts, step_output
from demo_platform import prepare_demo
from sluice_resource import resource_for

from dagster_project import PipelineDefinitions
from dagster_project._runs import PIPELINE_TAG
from dagster_project.continuous import (
    GENERATION_TAG,
    MODE_TAG,
    SLUICE_RUN_TAG,
    release_failed_run_splits,
)
from enumerator_service import SplitStore, connect_engine
from enumerator_service._operations import open_platform
from examples._clickstream_data import DemoSpec, generate_events

MakeSettings = Callable[..., TestSettings]
RUN_TAGS = (MODE_TAG, PIPELINE_TAG, GENERATION_TAG, SLUICE_RUN_TAG)


def _tick(
    built: PipelineDefinitions,
    instance: DagsterInstance,
    settings: TestSettings,
    cursor: str | None,
) -> tuple[Any, Any]:
    return sensor_tick(sensor_named(built, "continuous"), resource_for(settings), cursor, instance)


def _store(settings: TestSettings) -> SplitStore:
    assert settings.database_url is not None
    return SplitStore(connect_engine(settings.database_url.get_secret_value()))


def _add_run(
    instance: DagsterInstance,
    built: PipelineDefinitions,
    tags: dict[str, str],
    status: DagsterRunStatus,
) -> None:
    instance.add_run(DagsterRun(job_name=built.continuous_job.name, status=status, tags=tags))


def _small_data(settings: TestSettings) -> None:
    generate_events(settings.landing_path, DemoSpec.from_settings(settings))


def test_sensor_keeps_exactly_one_continuous_run_alive(make_settings: MakeSettings) -> None:
    settings = make_settings(demo_events=120, demo_users=50)
    _small_data(settings)
    built, store, source = demo_definitions(settings), _store(settings), settings.source_name
    files = settings.demo_days * settings.demo_files_per_day
    with DagsterInstance.ephemeral() as instance:
        # New files: registered, and one run requested (their splits reserved for it).
        first, cursor = _tick(built, instance, settings, None)
        assert isinstance(first, RunRequest)
        assert first.tags[GENERATION_TAG] == "1" and first.tags[MODE_TAG] == "continuous"
        assert first.tags[PIPELINE_TAG] == source
        run_id = first.tags[SLUICE_RUN_TAG]
        assert store.counts(source) == {"ASSIGNED": files}
        # Nothing new (and the requested run not created yet): skip, never a second request.
        second, cursor = _tick(built, instance, settings, cursor)
        assert isinstance(second, SkipReason)
        assert "generation 1" in (second.skip_message or "")
        # The run is live: a new file's split goes to it, no request.
        _add_run(instance, built, {k: first.tags[k] for k in RUN_TAGS}, DagsterRunStatus.STARTED)
        folder = settings.landing_path / "dt=2026-01-09"
        folder.mkdir()
        (folder / "late.jsonl").write_text(
            '{"event_id": "late-1", "user_id": 1, "event_time": "2026-01-09T00:00:00+00:00", '
            '"event_type": "click", "amount": 1.0}\n'
        )
        third, cursor = _tick(built, instance, settings, cursor)
        assert isinstance(third, SkipReason)
        assert "1 assigned to the live continuous run" in (third.skip_message or "")
        assert store.counts(source) == {"ASSIGNED": files + 1}
        with store._engine.connect() as conn:
            owners = {
                r[0]
                for r in conn.exec_driver_sql(
                    "SELECT DISTINCT run_id FROM sluice.splits WHERE source = %s", (source,)
                )
            }
        assert owners == {run_id}


def test_a_dead_continuous_run_gets_exactly_one_successor(make_settings: MakeSettings) -> None:
    settings = make_settings(demo_events=60, demo_users=20)
    _small_data(settings)
    built = demo_definitions(settings)
    with DagsterInstance.ephemeral() as instance:
        first, cursor = _tick(built, instance, settings, None)
        assert isinstance(first, RunRequest)
        _add_run(instance, built, {k: first.tags[k] for k in RUN_TAGS}, DagsterRunStatus.FAILURE)
        # No new files, but the continuous run died: exactly one new generation.
        again, cursor = _tick(built, instance, settings, cursor)
        assert isinstance(again, RunRequest)
        assert again.tags[GENERATION_TAG] == "2"
        assert again.run_key != first.run_key
        assert again.tags[SLUICE_RUN_TAG] != first.tags[SLUICE_RUN_TAG]
        third, _ = _tick(built, instance, settings, cursor)
        assert isinstance(third, SkipReason)  # the successor is requested, not yet running


def test_continuous_sensors_of_two_pipelines_keep_one_run_each(
    make_settings: MakeSettings,
) -> None:
    """One instance, two pipelines: a live run of one is not the other's live run."""
    one, other = make_settings(demo_events=30), make_settings(demo_events=30)
    _small_data(one)
    _small_data(other)
    built_one, built_other = demo_definitions(one), demo_definitions(other)
    with DagsterInstance.ephemeral() as instance:
        first, _ = _tick(built_one, instance, one, None)
        assert isinstance(first, RunRequest)
        _add_run(
            instance, built_one, {k: first.tags[k] for k in RUN_TAGS}, DagsterRunStatus.STARTED
        )
        theirs, _ = _tick(built_other, instance, other, None)
        assert isinstance(theirs, RunRequest)
        assert theirs.tags[PIPELINE_TAG] == other.source_name
        assert theirs.tags[SLUICE_RUN_TAG] != first.tags[SLUICE_RUN_TAG]


@pytest.mark.spark
def test_a_failed_runs_splits_are_reassigned_and_finished(make_settings: MakeSettings) -> None:
    settings = make_settings(demo_events=300, demo_users=100)
    platform = open_platform(settings)
    try:
        _small_data(settings)
        prepare_demo(settings, platform, events=False)
        built, source = demo_definitions(settings), settings.source_name
        registered = settings.demo_days * settings.demo_files_per_day
        request, _ = sensor_tick(sensor_named(built, "new_files"), resource_for(settings))
        assert request.tags["sluice/splits_registered"] == str(registered)
        store = SplitStore(platform.engine)

        @op
        def boom() -> None:
            raise RuntimeError("the reader run died")

        @job(tags={SLUICE_RUN_TAG: "run-that-fails"})
        def failing() -> None:
            boom()

        # The run took the splits (one of them is being read) and then failed.
        store.assign_to_run("run-that-fails", source, lease_seconds=3600)
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
        assert store.counts(source) == {"UNASSIGNED": registered}
        done = built.incremental_job.execute_in_process(
            resources={"sluice": resource_for(settings)}
        )
        assert done.success
        assert step_output(done)["splits"] == registered
        assert store.counts(source) == {"COMPLETED": registered}
    finally:
        platform.close()


@pytest.mark.spark
def test_the_continuous_run_takes_the_splits_its_sensor_feeds_it(
    make_settings: MakeSettings, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The sensor requests the run, the requested job runs; files landing while it is live are
    registered by the next tick and assigned to it; it reads them and ends after idling."""
    settings = make_settings(demo_events=400, demo_users=100, demo_days=1)
    monkeypatch.setenv("SLUICE_CHECKPOINT_INTERVAL_SECONDS", "0.5")
    monkeypatch.setenv("SLUICE_CONTINUOUS_POLL_SECONDS", "0.2")
    monkeypatch.setenv("SLUICE_CONTINUOUS_IDLE_SECONDS", "6")
    platform = open_platform(settings)
    try:
        prepare_demo(settings, platform)
    finally:
        platform.close()
    built, source, sluice = demo_definitions(settings), settings.source_name, resource_for(settings)
    store = _store(settings)
    # A persistent instance: the run (main thread) and the sensor (a thread) share it.
    with DagsterInstance.local_temp(str(tmp_path)) as instance:
        request, cursor = _tick(built, instance, settings, None)
        assert isinstance(request, RunRequest)
        fed: dict[str, Any] = {}

        def land_and_tick() -> None:
            mine = RunsFilter(tags={SLUICE_RUN_TAG: request.tags[SLUICE_RUN_TAG]})
            _wait(
                lambda: (
                    any(r.status == DagsterRunStatus.STARTED for r in instance.get_runs(mine))
                    and store.counts(source).get("COMPLETED", 0) > 0
                )
            )
            # New files arrive while the run is live; the sensor registers and assigns them.
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
            fed["tick"], fed["cursor"] = _tick(built, instance, settings, cursor)

        def feed() -> None:
            try:
                land_and_tick()
            except BaseException as exc:  # shown by the main thread
                fed["error"] = exc

        feeder = threading.Thread(target=feed)
        feeder.start()
        try:
            result = built.continuous_job.execute_in_process(
                tags=request.tags, resources={"sluice": sluice}, instance=instance
            )
        finally:
            feeder.join(timeout=120)
        assert "error" not in fed, fed["error"]
        assert result.success
        assert isinstance(fed["tick"], SkipReason)
        assert "1 new splits; 1 assigned to the live continuous run" in (
            fed["tick"].skip_message or ""
        )
        summary = step_output(result)
        rows = ds.dataset(settings.output_path, format="parquet").to_table().to_pylist()
        ids = [r["event_id"] for r in rows]
        assert len(ids) == len(set(ids)) == summary["rows_out"]
        assert {f"n-{i}" for i in range(5)} <= set(ids)
        assert set(split_counts(settings, source)) == {"COMPLETED"}
        # The run ended (idle): nothing new, so no next generation either.
        after, _ = _tick(built, instance, settings, fed["cursor"])
        assert isinstance(after, SkipReason)
        assert (after.skip_message or "").startswith("no new input")


def _wait(condition: Callable[[], bool], timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.1)
