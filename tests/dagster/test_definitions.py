"""The Dagster code location: it loads from ``SLUICE_PIPELINES``, every pipeline gets its
asset, jobs, sensors and schedule, its sensor discovers files, its asset materializes, its
schedule's runs process what landed since the last one.

No ``__init__.py`` in this folder on purpose: as a package it would be importable as
``dagster`` and shadow the real library.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow.compute as pc
import pytest
from conftest import TestSettings
from dagster import (
    DagsterInstance,
    DailyPartitionsDefinition,
    DefaultScheduleStatus,
    DefaultSensorStatus,
    Definitions,
    RunRequest,
    SkipReason,
    build_schedule_context,
    materialize,
)
from dagster_support import (
    demo_definitions,
    parquet_rows,
    schedule_of,
    sensor_named,
    sensor_tick,
    split_counts,
    step_output,
)
from demo_platform import prepare_demo
from sluice_resource import resource_for

from dagster_project import pipeline_definitions
from dagster_project.definitions import AUTOMATION_SENSOR, local_resources, pipelines_definitions
from dagster_project.resources import SluiceResource, SparkResource
from dagster_project.sensors import FilesSensorCursor
from enumerator_service import ConfigError
from enumerator_service._operations import open_platform
from examples._clickstream_data import DemoSpec, generate_events
from spark_jobs import FileSource, Filter, Lookup, ParquetSink, Pipeline, PostgresSink, TableSource

REPO = Path(__file__).resolve().parents[2]
MakeSettings = Callable[..., TestSettings]
EXAMPLES = "examples.clickstream,examples.clickstream_iceberg,examples.orders"

# Dagster 1.13 itself passes ``owners=[]`` when it binds resources to a sensor's job, which
# raises this beta warning (an error under the suite's filterwarnings) for any sensor.
OWNERS_WARNING = pytest.mark.filterwarnings(
    "ignore:Parameter `owners` of initializer `SensorDefinition.__init__`:"
    "dagster_shared.utils.warnings.BetaWarning"
)


def load_examples(
    monkeypatch: pytest.MonkeyPatch, data_dir: Path, modules: str = EXAMPLES
) -> Definitions:
    """The code location as ``dagster dev`` loads it, with ``SLUICE_PIPELINES=modules``."""
    monkeypatch.setenv("SLUICE_PIPELINES", modules)
    monkeypatch.setenv("SLUICE_DATA_DIR", str(data_dir))
    monkeypatch.delenv("DAGSTER_DEPLOYMENT", raising=False)
    return pipelines_definitions(local_resources())


# --------------------------------------------------------------------------- loading


def test_dagster_cli_validates_the_code_location(tmp_path: Path) -> None:
    dagster = Path(sys.executable).parent / "dagster"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLUICE_", "DAGSTER_"))}
    env.update(
        DAGSTER_HOME=str(tmp_path),
        SLUICE_PIPELINES=EXAMPLES,
        SLUICE_DATA_DIR=str(tmp_path / "data"),
    )
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
    assert "Validation successful" in result.stdout + result.stderr


@OWNERS_WARNING
def test_every_registered_pipeline_gets_its_asset_jobs_sensors_and_schedule(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    defs = load_examples(monkeypatch, tmp_path / "data")
    for name in ("clickstream", "clickstream_iceberg", "orders"):
        asset = defs.resolve_assets_def(name)
        assert asset.partitions_def is not None  # all read day-partitioned files
        assert asset.backfill_policy is not None
        assert asset.backfill_policy.max_partitions_per_run is None  # a backfill: one run

        incremental = defs.resolve_job_def(f"{name}_incremental")
        continuous = defs.resolve_job_def(f"{name}_continuous")
        assert continuous.tags["sluice/mode"] == "continuous"
        assert continuous.tags["sluice/pipeline"] == incremental.tags["sluice/pipeline"] == name

        sensor = defs.resolve_sensor_def(f"{name}_new_files")
        assert sensor.job_name == incremental.name
        assert sensor.minimum_interval_seconds == 30
        assert sensor.default_status == DefaultSensorStatus.STOPPED
        reader = defs.resolve_sensor_def(f"{name}_continuous")
        assert reader.job_name == continuous.name
        assert reader.default_status == DefaultSensorStatus.STOPPED
        # Reporting completed partitions is how Dagster sees every mode: on by default.
        reporter = defs.resolve_sensor_def(f"{name}_report_completions")
        assert reporter.default_status == DefaultSensorStatus.RUNNING

        schedule = defs.resolve_schedule_def(f"{name}_schedule")
        assert schedule.job_name == incremental.name
        assert schedule.cron_schedule == "0 * * * *"  # the pipelines' default schedule
        assert schedule.execution_timezone == "UTC"
        assert schedule.default_status == DefaultScheduleStatus.STOPPED

    failed = defs.resolve_sensor_def("release_failed_run_splits")
    assert failed.default_status == DefaultSensorStatus.RUNNING
    assert {s.name for s in defs.sensors or []} == {
        "release_failed_run_splits",
        *(
            f"{p}_{kind}"
            for p in ("clickstream", "clickstream_iceberg", "orders")
            for kind in ("new_files", "continuous", "report_completions", "live_state")
        ),
        # The Iceberg table's compaction of completed days; the revenue asset's automation.
        "clickstream_iceberg_compact_completed_days",
        AUTOMATION_SENSOR,
    }
    assert isinstance(defs.resources["sluice"], SluiceResource)


@OWNERS_WARNING
def test_partitions_start_at_the_earliest_landing_day(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """``SLUICE_DAGSTER_PARTITIONS=daily`` without a ``start_date``: the first partition is
    the earliest ``dt=`` folder holding a data file when the code location loads (each
    pipeline its own), else today."""
    monkeypatch.setattr("dagster_project.assets._PARTITIONS", {})
    monkeypatch.setenv("SLUICE_DAGSTER_PARTITIONS", "daily")
    landing = tmp_path / "data" / "landing"
    for day in ("2026-03-04", "2026-02-11", "2026-05-01"):
        (landing / "events" / f"dt={day}").mkdir(parents=True)
        (landing / "events" / f"dt={day}" / "part-0.jsonl").write_text("{}\n")
    (landing / "events" / "dt=2026-01-20").mkdir()  # no data file yet
    (landing / "events" / "not-a-day").mkdir()
    defs = load_examples(monkeypatch, tmp_path / "data")
    first = defs.resolve_assets_def("clickstream").partitions_def
    assert first is not None and first.get_first_partition_key() == "2026-02-11"
    # No landing folder: partitions from today on (the first one exists once today is over).
    orders = defs.resolve_assets_def("orders").partitions_def
    assert isinstance(orders, DailyPartitionsDefinition)
    assert orders.start.date() == datetime.now(UTC).date()


def test_a_bad_registration_fails_the_code_location(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    with pytest.raises(ConfigError, match=r"SLUICE_PIPELINES: no module named 'examples\.nope'"):
        load_examples(monkeypatch, tmp_path, "examples.clickstream,examples.nope")
    with pytest.raises(ConfigError, match="defines no Pipeline"):
        load_examples(monkeypatch, tmp_path, "examples._orders_data")


# --------------------------------------------------------------------------- the factory


def _files(**changes: Any) -> FileSource:
    values: dict[str, Any] = {
        "schema": {"id": "int64", "amount": "decimal(10,2)", "region": "string"},
        "required": ["id"],
        **changes,
    }
    return FileSource(**values)


def test_an_unpartitioned_pipeline_has_an_unpartitioned_asset_and_no_key_check() -> None:
    pipeline = Pipeline(
        name="flat_things",
        source=_files(partition_by=None, landing="/srv/flat"),
        steps=[Filter(pc.field("id") > 0)],
        sink=ParquetSink(),
    )
    built = pipeline_definitions(pipeline, SluiceResource().settings())
    assert built.partitions is None
    assert built.output.partitions_def is None
    assert built.output.backfill_policy is None
    assert [key.to_user_string() for key in built.output.keys] == ["flat_things"]
    assert [key.to_user_string() for s in built.source_assets for key in s.keys] == [
        "flat_things_landing"
    ]
    # No key declared: no unique-key check; the other three always.
    assert sorted(key.name for c in built.checks for key in c.check_keys) == [
        "dead_letter_ratio",
        "no_quarantined_splits",
        "rows_reconcile",
    ]
    assert [j.name for j in built.jobs] == ["flat_things_incremental", "flat_things_continuous"]


def test_a_table_source_and_its_lookups_are_observable_tables() -> None:
    pipeline = Pipeline(
        name="table_things",
        source=TableSource("sales.things", key="id", schema={"id": "int64", "region": "string"}),
        steps=[
            Lookup("geo.regions", on={"region": "code"}, columns=["country"]),
            Lookup("sales.things", on="id", columns={"region": "again"}),  # read twice
        ],
        sink=PostgresSink("sales.things_out", upsert_key=["id"]),
        schedule="*/15 * * * *",
    )
    built = pipeline_definitions(pipeline, SluiceResource().settings())
    assert built.partitions is None
    keys = [key.to_user_string() for s in built.source_assets for key in s.keys]
    assert keys == ["sales/things", "geo/regions", "sales/things"]
    # The code location keeps one asset per key (definitions.pipelines_definitions).
    unique = {key: s for s in reversed(built.source_assets) for key in s.keys}
    graph = Definitions(
        assets=[*unique.values(), built.output], resources={"sluice": SluiceResource()}
    )
    parents = graph.resolve_asset_graph().get(built.output.key).parent_keys
    assert {key.to_user_string() for key in parents} == {"sales/things", "geo/regions"}
    # The upsert key is the output's key: checked for uniqueness.
    assert "unique_key" in {key.name for c in built.checks for key in c.check_keys}
    assert schedule_of(built).cron_schedule == "*/15 * * * *"


# --------------------------------------------------------------------------- resource


def test_resource_passes_only_the_configured_fields(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLUICE_PARALLELISM", "7")
    monkeypatch.setenv("SLUICE_LEASE_SECONDS", "90")
    monkeypatch.delenv("SLUICE_DATABASE_URL", raising=False)

    assert SluiceResource().overrides() == {}
    settings = SluiceResource(lease_seconds=5.0, discovery_max_files_per_tick=9).settings()
    assert settings.parallelism == 7  # unset in the resource: the environment applies
    assert settings.lease_seconds == 5.0  # set in the resource: it wins
    assert settings.discovery_max_files_per_tick == 9
    assert settings.database_url is None


def test_resource_reports_a_bad_value_as_config_error() -> None:
    with pytest.raises(ConfigError, match="SLUICE_PARALLELISM"):
        SluiceResource(spark=SparkResource(parallelism=0)).settings()


# --------------------------------------------------------------------------- sensor


def _land(settings: TestSettings, events: int) -> None:
    spec = dataclasses.replace(DemoSpec.from_settings(settings), events=events)
    generate_events(settings.landing_path, spec)


def test_sensor_requests_a_run_for_new_files_then_skips(make_settings: MakeSettings) -> None:
    settings = make_settings()
    _land(settings, 120)
    files = settings.demo_days * settings.demo_files_per_day
    built = demo_definitions(settings)
    sensor, sluice = sensor_named(built, "new_files"), resource_for(settings)
    source = settings.source_name

    first, first_cursor = sensor_tick(sensor, sluice)
    assert isinstance(first, RunRequest)
    assert first.run_key is not None
    assert first.run_key.startswith(f"{source}:1:")
    assert first.tags["sluice/splits_registered"] == str(files)
    assert first.tags["sluice/pipeline"] == source
    assert first.job_name in (None, built.incremental_job.name)
    assert split_counts(settings, source) == {"UNASSIGNED": files}

    second, _ = sensor_tick(sensor, sluice, first_cursor)
    assert isinstance(second, SkipReason)
    assert second.skip_message is not None
    assert second.skip_message.startswith("no new input")

    # One more file arrives: a new run with a new key.
    folder = settings.landing_path / "dt=2026-01-05"
    folder.mkdir()
    (folder / "part-00000.jsonl").write_text(
        '{"event_id": "x-1", "user_id": 1, "event_time": "2026-01-05T00:00:00+00:00", '
        '"event_type": "click", "amount": 0.0}\n'
    )
    third, third_cursor = sensor_tick(sensor, sluice, first_cursor)
    assert isinstance(third, RunRequest)
    assert third.run_key not in (None, first.run_key)
    assert third.tags["sluice/splits_registered"] == "1"
    assert FilesSensorCursor.parse(third_cursor) == FilesSensorCursor(sequence=2, backlog_files=0)
    assert FilesSensorCursor.parse("7") == FilesSensorCursor(sequence=7)  # the older format
    assert split_counts(settings, source) == {"UNASSIGNED": files + 1}


def test_sensor_never_puts_the_password_in_its_result(make_settings: MakeSettings) -> None:
    settings = make_settings()
    _land(settings, 20)
    assert settings.database_url is not None
    secret = settings.database_url.get_secret_value()
    result, _ = sensor_tick(
        sensor_named(demo_definitions(settings), "new_files"), resource_for(settings)
    )
    assert isinstance(result, RunRequest)
    shown = repr(result)
    assert secret not in shown
    assert "postgres" not in shown


def test_sensors_of_two_pipelines_keep_to_their_own_files(make_settings: MakeSettings) -> None:
    """Two pipelines in one code location: each sensor registers its own landing folder's
    files as its own splits."""
    one, other = make_settings(), make_settings()
    _land(one, 40)
    (other.landing_path / "dt=2026-01-01").mkdir(parents=True)
    (other.landing_path / "dt=2026-01-01" / "only.jsonl").write_text("{}\n")
    ticks = {
        s.source_name: sensor_tick(sensor_named(demo_definitions(s), "new_files"), resource_for(s))[
            0
        ]
        for s in (one, other)
    }
    files = one.demo_days * one.demo_files_per_day
    assert ticks[one.source_name].tags["sluice/splits_registered"] == str(files)
    assert ticks[other.source_name].tags["sluice/splits_registered"] == "1"
    assert split_counts(one, one.source_name) == {"UNASSIGNED": files}
    assert split_counts(one, other.source_name) == {"UNASSIGNED": 1}


def test_a_pipeline_registered_before_its_first_file(make_settings: MakeSettings) -> None:
    """No landing folder yet: the sensors skip and an incremental run finds nothing (files
    are to come); a partition asked for by day fails, naming the folder. The first file then
    starts the usual work."""
    settings = make_settings()
    platform = open_platform(settings)
    try:
        prepare_demo(settings, platform, events=False)
    finally:
        platform.close()
    built, sluice = demo_definitions(settings), resource_for(settings)
    with DagsterInstance.ephemeral() as instance:
        files, _ = sensor_tick(sensor_named(built, "new_files"), sluice)
        assert isinstance(files, SkipReason)
        assert files.skip_message == (
            f"nothing to discover yet (landing folder {settings.landing_path} does not exist yet)"
        )
        reader, _ = sensor_tick(sensor_named(built, "continuous"), sluice, None, instance)
        assert isinstance(reader, SkipReason)
        assert (reader.skip_message or "").startswith("no new input (0 files seen)")

        run = built.incremental_job.execute_in_process(resources={"sluice": sluice})
        assert run.success
        assert step_output(run)["nothing_new"] is True

        day = materialize(
            [built.output],
            partition_key="2026-01-01",
            resources={"sluice": sluice},
            instance=instance,
            raise_on_error=False,
        )
        assert not day.success
        (failure,) = [e for e in day.all_events if e.event_type_value == "STEP_FAILURE"]
        assert "folder does not exist" in str(failure.event_specific_data.error)

    _land(settings, 10)
    files, _ = sensor_tick(sensor_named(built, "new_files"), sluice)
    assert isinstance(files, RunRequest)


# --------------------------------------------------------------------------- Spark runs


@pytest.fixture
def tiny_dataset(make_settings: MakeSettings) -> TestSettings:
    """Two days x three files of events, and ``public.users``."""
    settings = make_settings(demo_events=600, demo_users=300)
    platform = open_platform(settings)
    try:
        prepare_demo(settings, platform)
    finally:
        platform.close()
    return settings


def _materialization(result: Any, name: str) -> dict[str, Any]:
    (event,) = result.asset_materializations_for_node(name)
    return {key: value.value for key, value in event.metadata.items()}


@pytest.mark.spark
def test_a_partition_materializes_and_a_rerun_replaces_it(tiny_dataset: TestSettings) -> None:
    settings = tiny_dataset
    built, sluice = demo_definitions(settings), resource_for(settings)
    day, name = "2026-01-01", settings.source_name
    with DagsterInstance.ephemeral() as instance:
        result = materialize(
            [built.output], partition_key=day, resources={"sluice": sluice}, instance=instance
        )
        assert result.success
        metadata = _materialization(result, name)
        assert metadata["pipeline"] == name
        assert metadata["rows_out"] > 0
        assert metadata["splits"] == settings.demo_files_per_day  # only that day's files
        assert metadata["nothing_new"] is False
        assert metadata["rows_in"] == metadata["rows_out"] + metadata["dead_letters"]
        output = settings.output_path / f"dt={day}"
        assert metadata["output"] == str(output)
        assert parquet_rows(output) == metadata["rows_out"]
        assert not (settings.output_path / "dt=2026-01-02").exists()

        # Re-running the partition replaces its output: read again, never duplicated.
        again = materialize(
            [built.output], partition_key=day, resources={"sluice": sluice}, instance=instance
        )
        assert again.success
        rerun = _materialization(again, name)
        assert rerun["rebuilt_partitions"] == day
        assert rerun["rows_out"] == metadata["rows_out"]
        assert parquet_rows(output) == metadata["rows_out"]


@pytest.mark.spark
def test_incremental_job_processes_everything_unassigned(tiny_dataset: TestSettings) -> None:
    settings = tiny_dataset
    built = demo_definitions(settings)
    files = settings.demo_days * settings.demo_files_per_day
    # A per-tick cap below the number of files: the run drains the whole backlog first.
    capped = resource_for(settings, discovery_max_files_per_tick=4)
    result = built.incremental_job.execute_in_process(resources={"sluice": capped})
    assert result.success
    output = step_output(result)
    assert output["splits"] == output["splits_registered"] == files
    assert output["rows_out"] > 0
    assert parquet_rows(settings.output_path) == output["rows_out"]
    assert split_counts(settings, settings.source_name) == {"COMPLETED": files}

    # Nothing new the second time.
    again = built.incremental_job.execute_in_process(resources={"sluice": resource_for(settings)})
    assert again.success
    assert step_output(again)["nothing_new"] is True


@pytest.mark.spark
def test_schedule_ticks_run_everything_discovered_since_the_last_run(
    tiny_dataset: TestSettings,
) -> None:
    settings, sluice = tiny_dataset, resource_for(tiny_dataset)
    built = demo_definitions(settings)
    schedule, job = schedule_of(built), built.incremental_job
    assert schedule.job_name == job.name

    def tick(hour: int) -> dict[str, Any]:
        when = datetime(2026, 11, 21, hour, tzinfo=UTC)
        data = schedule.evaluate_tick(build_schedule_context(scheduled_execution_time=when))
        (request,) = data.run_requests or []
        assert isinstance(request, RunRequest)
        result = job.execute_in_process(
            run_config=request.run_config, tags=request.tags, resources={"sluice": sluice}
        )
        assert result.success
        return step_output(result)

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
