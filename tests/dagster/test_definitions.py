"""The Dagster code location: it loads, its sensor discovers files, its asset materializes.

No ``__init__.py`` in this folder on purpose: as a package it would be importable as
``dagster`` and shadow the real library.
"""

from __future__ import annotations

import dataclasses
import os
import secrets
import subprocess
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from dagster import (
    DagsterInstance,
    DefaultScheduleStatus,
    DefaultSensorStatus,
    RunRequest,
    SkipReason,
    build_schedule_context,
    build_sensor_context,
    materialize,
)
from enumerator_service._demo_data import DemoSpec, generate_events, load_users
from sluice_resource import resource_for

from dagster_project.assets import PARTITIONS_START_DATE, enriched_events
from dagster_project.definitions import defs as load_defs
from dagster_project.jobs import process_new_splits_job
from dagster_project.resources import (
    SluiceResource,
)
from dagster_project.schedules import hourly_incremental_schedule
from dagster_project.sensors import FilesSensorCursor, new_files_sensor
from enumerator_service import ConfigError, Settings, SplitStore, asyncpg_dsn, connect_engine

REPO = Path(__file__).resolve().parents[2]
MakeSettings = Callable[..., Settings]


def demo_spec(settings: Settings, **changes: Any) -> DemoSpec:
    return dataclasses.replace(DemoSpec.from_settings(settings), **changes)


def sensor_tick(sluice: SluiceResource, cursor: str | None = None) -> tuple[Any, str | None]:
    """One evaluation of the sensor: its result and its cursor afterwards.

    The context is opened as a context manager: SluiceResource has nested resources.
    """
    with build_sensor_context(resources={"sluice": sluice}, cursor=cursor) as context:
        return new_files_sensor(context), context.cursor


def split_counts(settings: Settings) -> dict[str, int]:
    assert settings.database_url is not None
    engine = connect_engine(settings.database_url.get_secret_value())
    try:
        return SplitStore(engine).counts(settings.source_name)
    finally:
        engine.dispose()


# --------------------------------------------------------------------------- loading


def test_dagster_cli_validates_the_code_location(tmp_path: Path) -> None:
    dagster = Path(sys.executable).parent / "dagster"
    env = {**os.environ, "DAGSTER_HOME": str(tmp_path)}
    result = subprocess.run(
        [str(dagster), "definitions", "validate", "-m", "dagster_project.definitions"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


# Dagster 1.13 itself passes ``owners=[]`` when it binds resources to a sensor's job, which
# raises this beta warning (an error under the suite's filterwarnings) for any sensor.
@pytest.mark.filterwarnings(
    "ignore:Parameter `owners` of initializer `SensorDefinition.__init__`:"
    "dagster_shared.utils.warnings.BetaWarning"
)
def test_definitions_hold_the_asset_job_sensor_and_schedule() -> None:
    defs = load_defs()
    asset = defs.resolve_assets_def("enriched_events")
    assert asset.key == enriched_events.key
    assert asset.partitions_def is not None
    assert asset.partitions_def.get_first_partition_key() == PARTITIONS_START_DATE

    assert defs.resolve_job_def("process_new_splits_job").name == "process_new_splits_job"

    sensor = defs.resolve_sensor_def("new_files_sensor")
    assert sensor.job_name == "process_new_splits_job"
    assert sensor.minimum_interval_seconds == 30
    assert sensor.default_status == DefaultSensorStatus.STOPPED

    schedule = defs.resolve_schedule_def("hourly_incremental_schedule")
    assert schedule.job_name == "process_new_splits_job"
    assert schedule.cron_schedule == "0 * * * *"
    assert schedule.default_status == DefaultScheduleStatus.STOPPED

    assert isinstance(defs.resources["sluice"], SluiceResource)


# --------------------------------------------------------------------------- resource


def test_resource_passes_only_the_configured_fields(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLUICE_PARALLELISM", "7")
    monkeypatch.setenv("SLUICE_SOURCE_NAME", "from_env")
    monkeypatch.delenv("SLUICE_DATABASE_URL", raising=False)

    assert SluiceResource().overrides() == {}
    settings = SluiceResource(source_name="clicks", lease_seconds=5.0).settings()
    assert settings.parallelism == 7  # unset in the resource: the environment applies
    assert settings.source_name == "clicks"  # set in the resource: it wins
    assert settings.lease_seconds == 5.0
    assert settings.database_url is None


def test_resource_reports_a_bad_value_as_config_error() -> None:
    with pytest.raises(ConfigError, match="SLUICE_SOURCE_NAME"):
        SluiceResource(source_name="Not An Identifier").settings()


# --------------------------------------------------------------------------- sensor


def test_sensor_requests_a_run_for_new_files_then_skips(make_settings: MakeSettings) -> None:
    settings = make_settings()
    generate_events(settings.landing_path, demo_spec(settings, events=120, users=50))
    files = settings.demo_days * settings.demo_files_per_day
    sluice = resource_for(settings)

    first, first_cursor = sensor_tick(sluice)
    assert isinstance(first, RunRequest)
    assert first.run_key is not None
    assert first.run_key.startswith(f"{settings.source_name}:1:")
    assert first.tags["sluice/splits_registered"] == str(files)
    assert split_counts(settings) == {"UNASSIGNED": files}

    second, _ = sensor_tick(sluice, first_cursor)
    assert isinstance(second, SkipReason)
    assert second.skip_message is not None
    assert second.skip_message.startswith("no new files")

    # One more file arrives: a new run with a new key.
    folder = settings.landing_path / "dt=2026-01-05"
    folder.mkdir()
    (folder / "part-00000.jsonl").write_text(
        '{"event_id": "x-1", "user_id": 1, "event_time": "2026-01-05T00:00:00+00:00", '
        '"event_type": "click", "amount": 0.0}\n'
    )
    third, third_cursor = sensor_tick(sluice, first_cursor)
    assert isinstance(third, RunRequest)
    assert third.run_key not in (None, first.run_key)
    assert third.tags["sluice/splits_registered"] == "1"
    assert FilesSensorCursor.parse(third_cursor) == FilesSensorCursor(sequence=2, backlog_files=0)
    assert FilesSensorCursor.parse("7") == FilesSensorCursor(sequence=7)  # the older format
    assert split_counts(settings) == {"UNASSIGNED": files + 1}


def test_sensor_never_puts_the_password_in_its_result(make_settings: MakeSettings) -> None:
    settings = make_settings()
    generate_events(settings.landing_path, demo_spec(settings, events=20, users=10))
    assert settings.database_url is not None
    secret = settings.database_url.get_secret_value()
    result, _ = sensor_tick(resource_for(settings))
    assert isinstance(result, RunRequest)
    shown = repr(result)
    assert secret not in shown
    assert "postgres" not in shown


# --------------------------------------------------------------------------- Spark runs


@pytest.fixture
def tiny_dataset(make_settings: MakeSettings, db_url: str) -> Settings:
    """Two days x three files of events, plus a users table of this test's own."""
    token = secrets.token_hex(3)
    settings = make_settings(
        source_name=f"ev_{token}", lookup_table=f"users_{token}", demo_events=600, demo_users=300
    )
    generate_events(settings.landing_path, demo_spec(settings))
    load_users(
        asyncpg_dsn(db_url),
        schema=settings.lookup_schema,
        table=settings.lookup_table,
        key=settings.lookup_key,
        users=settings.demo_users,
        seed=settings.demo_seed,
    )
    return settings


def parquet_rows(folder: Path) -> int:
    files = sorted(folder.rglob("*.parquet"))
    return sum(pq.ParquetFile(f).metadata.num_rows for f in files)


@pytest.mark.spark
def test_enriched_events_partition_materializes(tiny_dataset: Settings) -> None:
    settings = tiny_dataset
    sluice = resource_for(settings)
    with DagsterInstance.ephemeral() as instance:
        result = materialize(
            [enriched_events],
            partition_key="2026-01-01",
            resources={"sluice": sluice},
            instance=instance,
        )
        assert result.success
        (event,) = result.asset_materializations_for_node("enriched_events")
        metadata = {key: value.value for key, value in event.metadata.items()}
        assert metadata["rows_out"] > 0
        assert metadata["splits"] == settings.demo_files_per_day  # only that day's files
        assert metadata["nothing_new"] is False
        assert metadata["rows_in"] == metadata["rows_out"] + metadata["dead_letters"]
        output = settings.output_path / "dt=2026-01-01"
        assert metadata["output_path"] == str(output)
        assert parquet_rows(output) == metadata["rows_out"]
        assert not (settings.output_path / "dt=2026-01-02").exists()

        # Re-running the partition never duplicates its output.
        again = materialize(
            [enriched_events],
            partition_key="2026-01-01",
            resources={"sluice": sluice},
            instance=instance,
        )
        assert again.success
        assert parquet_rows(output) == metadata["rows_out"]


@pytest.mark.spark
def test_incremental_job_processes_everything_unassigned(tiny_dataset: Settings) -> None:
    settings = tiny_dataset
    # A per-tick cap below the number of files: the run drains the whole backlog first.
    capped = resource_for(settings, discovery_max_files_per_tick=4)
    result = process_new_splits_job.execute_in_process(resources={"sluice": capped})
    assert result.success
    (output,) = [
        event.event_specific_data.metadata
        for event in result.all_events
        if event.event_type_value == "STEP_OUTPUT"
    ]
    assert output["splits"].value == settings.demo_days * settings.demo_files_per_day
    assert output["splits_registered"].value == settings.demo_days * settings.demo_files_per_day
    assert output["rows_out"].value > 0
    assert parquet_rows(settings.output_path) == output["rows_out"].value

    # Nothing new the second time.
    again = process_new_splits_job.execute_in_process(resources={"sluice": resource_for(settings)})
    assert again.success
    (output,) = [
        event.event_specific_data.metadata
        for event in again.all_events
        if event.event_type_value == "STEP_OUTPUT"
    ]
    assert output["nothing_new"].value is True


def _step_output(result: Any) -> dict[str, Any]:
    (metadata,) = [
        event.event_specific_data.metadata
        for event in result.all_events
        if event.event_type_value == "STEP_OUTPUT"
    ]
    return {key: value.value for key, value in metadata.items()}


@pytest.mark.spark
def test_schedule_ticks_run_everything_discovered_since_the_last_run(
    tiny_dataset: Settings,
) -> None:
    settings, sluice = tiny_dataset, resource_for(tiny_dataset)
    schedule = hourly_incremental_schedule

    def tick(hour: int) -> dict[str, Any]:
        when = datetime(2026, 11, 21, hour, tzinfo=UTC)
        data = schedule.evaluate_tick(build_schedule_context(scheduled_execution_time=when))
        (request,) = data.run_requests or []
        assert isinstance(request, RunRequest)
        assert schedule.job_name == process_new_splits_job.name
        result = process_new_splits_job.execute_in_process(
            run_config=request.run_config, tags=request.tags, resources={"sluice": sluice}
        )
        assert result.success
        return _step_output(result)

    files = settings.demo_days * settings.demo_files_per_day
    first = tick(1)
    assert first["splits"] == first["splits_registered"] == files
    assert first["rows_out"] == parquet_rows(settings.output_path) > 0
    assert tick(2)["nothing_new"] is True
    # A file landing between two ticks is what the next run processes — and only it.
    late = settings.landing_path / "dt=2026-01-02" / "part-late.jsonl"
    late.write_text(
        '{"event_id": "late-1", "user_id": 1, "event_time": "2026-01-02T12:00:00Z", '
        '"event_type": "click", "amount": 0}\n'
    )
    third = tick(3)
    assert (third["splits_registered"], third["splits"], third["rows_out"]) == (1, 1, 1)
    assert parquet_rows(settings.output_path) == first["rows_out"] + 1
