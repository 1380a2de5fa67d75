"""The assets, checks, observations and resources a pipeline gets, on real services.

One dataset (two days of landing files plus a users table of its own) and one Spark session
serve every Spark test of this module: a module-scoped fixture materialises the test's
pipeline (the clickstream example under a name of its own, writing ``enriched_events`` in its
own warehouse) for both days in ONE run (the single-run backfill path: a partition range),
the tests read what that run left (the revenue example, downstream of the Iceberg variant of
the pipeline, is tested in test_iceberg_revenue.py).

No ``__init__.py`` in this folder on purpose (see test_definitions.py).
"""

from __future__ import annotations

import dataclasses
import hashlib
import secrets
import shutil
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import date
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
import sqlalchemy as sa
from conftest import TestSettings, load_test_settings
from dagster import (
    AssetCheckEvaluation,
    AssetCheckKey,
    AssetsDefinition,
    AssetSelection,
    AutomationConditionSensorDefinition,
    DagsterInstance,
    DefaultSensorStatus,
    Definitions,
    ExecuteInProcessResult,
    build_resources,
    define_asset_job,
    materialize,
)
from dagster._core.remote_representation.external_data import RepositorySnap
from dagster_shared.serdes import serialize_value
from dagster_support import with_start_date
from demo_platform import DICTIONARY, demo_pipeline
from sluice_resource import resource_for

from dagster_project import PipelineDefinitions, pipeline_definitions
from dagster_project.definitions import AUTOMATION_SENSOR
from dagster_project.definitions import defs as load_defs
from dagster_project.resources import (
    DatabaseResource,
    PathsResource,
    SluiceResource,
    SparkResource,
)
from enumerator_service import Settings, asyncpg_dsn
from examples._clickstream_data import DemoSpec, generate_events, load_users
from examples.clickstream import clickstream
from spark_jobs import ParquetSink, Pipeline
from spark_jobs.connectors.files import landing_path, list_landing
from spark_jobs.connectors.parquet import output_path

DAYS = ["2026-01-01", "2026-01-02"]
RANGE_TAGS = {
    "dagster/asset_partition_range_start": DAYS[0],
    "dagster/asset_partition_range_end": DAYS[-1],
}
#: What every materialisation of a pipeline's output reports.
RUN_METADATA = {
    "pipeline",
    "splits",
    "rows_in",
    "rows_out",
    "dead_letters",
    "lookups",
    "lookup_p50_ms",
    "lookup_p99_ms",
    "cache_hit_rate",
    "cache_bypass_rate",
    "checkpoints_completed",
    "checkpoints_aborted",
    "checkpoint_p50_ms",
    "checkpoint_p99_ms",
    "rows_per_second",
    "output",
}
CHECKS = {"unique_key", "rows_reconcile", "dead_letter_ratio", "no_quarantined_splits"}
#: An extra landing file of day one: two good events and two malformed lines.
EXTRA_FILE = (
    b'{"event_id": "extra-1", "user_id": 1, "event_time": "2026-01-01T12:00:00+00:00", '
    b'"event_type": "order", "amount": 10.5}\n'
    b"{not json\n"
    b'{"event_id": "extra-2", "user_id": 2, "event_time": "2026-01-01T13:00:00+00:00", '
    b'"event_type": "click", "amount": "twelve"}\n'
    b'{"event_id": "extra-3", "user_id": 999999, "event_time": "2026-01-01T14:00:00+00:00", '
    b'"event_type": "order", "amount": 4.5}\n'
)

# Dagster 1.13 itself passes ``owners=[]`` when it binds resources to a sensor's job.
OWNERS_WARNING = pytest.mark.filterwarnings(
    "ignore:Parameter `owners` of initializer `SensorDefinition.__init__`:"
    "dagster_shared.utils.warnings.BetaWarning"
)


def base_settings(db_url: str, root: Path, **overrides: Any) -> TestSettings:
    """Settings on the test database with data under ``root`` (see conftest.make_settings)."""
    values: dict[str, Any] = {
        "database_url": db_url,
        "home": root / "home",
        "data_dir": root / "data",
        "source_name": f"ev_{secrets.token_hex(3)}",
        "spark_master": "local[2]",
        "parallelism": 2,
        "demo_events": 600,
        "demo_users": 300,
        "demo_days": 2,
        "demo_files_per_day": 3,
        "demo_start_date": date(2026, 1, 1),
        **overrides,
    }
    return load_test_settings(**values)


def own_pipeline(settings: TestSettings, users: str, table: str | None = None) -> Pipeline:
    """The test's demo pipeline, looking users up in ``public.<users>`` and writing Parquet
    to ``<warehouse>/<table>`` (default ``enriched_<name>``)."""
    pipeline = demo_pipeline(
        settings, steps=[dataclasses.replace(clickstream.steps[0], table=f"public.{users}")]
    )
    if table is not None:
        pipeline = dataclasses.replace(pipeline, sink=ParquetSink(table, dictionary=DICTIONARY))
    return with_start_date(pipeline, settings)


def load_user_table(settings: Settings, table: str) -> None:
    assert settings.database_url is not None
    load_users(
        asyncpg_dsn(settings.database_url.get_secret_value()),
        schema="public",
        table=table,
        key="id",
        users=settings.demo_users,
        seed=settings.demo_seed,
    )


def observe(asset: AssetsDefinition, sluice: SluiceResource) -> ExecuteInProcessResult:
    """Run an observable asset's observation, as the UI's "Observe" button does."""
    job = define_asset_job("observe", selection=AssetSelection.assets(asset))
    defs = Definitions(assets=[asset], jobs=[job], resources={"sluice": sluice})
    return defs.resolve_job_def("observe").execute_in_process()


def observation_metadata(result: ExecuteInProcessResult) -> tuple[dict[str, Any], str | None]:
    (event,) = [e for e in result.all_events if e.event_type_value == "ASSET_OBSERVATION"]
    observation = event.asset_observation_data.asset_observation
    metadata = {key: value.value for key, value in observation.metadata.items()}
    return metadata, observation.tags.get("dagster/data_version")


def values(metadata: Mapping[str, Any]) -> dict[str, Any]:
    return {key: value.value for key, value in metadata.items()}


def parquet_files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.glob("*.parquet") if not p.name.startswith((".", "_")))


def parquet_rows(folder: Path) -> int:
    return sum(pq.read_metadata(path).num_rows for path in parquet_files(folder))


# --------------------------------------------------------------------------- resources


def test_nested_resources_override_their_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLUICE_PARALLELISM", "7")
    monkeypatch.delenv("SLUICE_SPARK_MASTER", raising=False)
    sluice = SluiceResource(
        database=DatabaseResource(url="postgresql://u@db/x"),
        spark=SparkResource(driver_host="driver"),
        paths=PathsResource(data_dir="/srv/data", warehouse_dir="/srv/out"),
        lookup_capacity=3,
    )
    assert sluice.overrides() == {
        "database_url": "postgresql://u@db/x",
        "spark_driver_host": "driver",
        "data_dir": "/srv/data",
        "warehouse_dir": "/srv/out",
        "lookup_capacity": 3,
    }
    settings = sluice.settings()
    assert settings.parallelism == 7  # unset in the resource: the environment at call time
    assert settings.spark_master == "local[*]"  # and the default
    assert settings.lookup_capacity == 3
    # Where a pipeline reads and writes follows: its folders are under those roots.
    assert landing_path(clickstream, settings) == Path("/srv/data/landing/events")
    assert output_path(clickstream, settings) == Path("/srv/out/enriched_events")


@OWNERS_WARNING
def test_local_definitions_leave_everything_to_the_environment(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("DAGSTER_DEPLOYMENT", raising=False)
    monkeypatch.setenv("SLUICE_PIPELINES", "examples.clickstream")
    monkeypatch.setenv("SLUICE_DATA_DIR", str(tmp_path))
    defs = load_defs()
    sluice = defs.resources["sluice"]
    assert isinstance(sluice, SluiceResource)
    assert sluice.overrides() == {}
    graph = defs.resolve_asset_graph()
    assert {key.to_user_string() for key in graph.get_all_asset_keys()} == {
        "clickstream_landing",
        "public/users",
        "clickstream",
    }
    # Lineage: landing folder + users table -> clickstream.
    output = defs.resolve_assets_def("clickstream")
    assert {k.to_user_string() for k in graph.get(output.key).parent_keys} == {
        "clickstream_landing",
        "public/users",
    }
    assert output.backfill_policy is not None
    assert output.backfill_policy.max_partitions_per_run is None  # single run
    assert {key.name for key in graph.asset_check_keys} == {*CHECKS, "watermark_freshness"}
    assert {key.asset_key for key in graph.asset_check_keys} == {output.key}
    # No asset with an automation condition: no automation sensor.
    assert AUTOMATION_SENSOR not in {sensor.name for sensor in defs.sensors or ()}

    monkeypatch.setenv("DAGSTER_DEPLOYMENT", "staging")
    with pytest.raises(ValueError, match="DAGSTER_DEPLOYMENT: 'staging'"):
        load_defs()


@OWNERS_WARNING
def test_the_iceberg_example_adds_the_revenue_asset_and_the_automation_sensor(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The default pipelines: ``daily_revenue_by_country`` is downstream of
    ``clickstream_iceberg`` (its partitions, its group) with an automation condition, which
    the code location's ``sluice_automation`` sensor (running by default) evaluates."""
    monkeypatch.delenv("DAGSTER_DEPLOYMENT", raising=False)
    monkeypatch.setenv(
        "SLUICE_PIPELINES", "examples.clickstream,examples.clickstream_iceberg,examples.orders"
    )
    monkeypatch.setenv("SLUICE_DATA_DIR", str(tmp_path))
    defs = load_defs()
    graph = defs.resolve_asset_graph()
    output = defs.resolve_assets_def("clickstream_iceberg")
    revenue = defs.resolve_assets_def("daily_revenue_by_country")
    assert graph.get(revenue.key).parent_keys == {output.key}
    assert {k.to_user_string() for k in graph.get(output.key).parent_keys} == {
        "clickstream_iceberg_landing",
        "public/users",
    }
    assert revenue.partitions_def == output.partitions_def
    assert revenue.group_names_by_key[revenue.key] == "clickstream_iceberg"
    assert revenue.backfill_policy is not None
    assert revenue.backfill_policy.max_partitions_per_run is None  # single run
    assert revenue.automation_conditions_by_key[revenue.key] is not None
    assert (
        output.automation_conditions_by_key.get(output.key) is None
    )  # Sluice reports the pipeline's days itself
    (sensor,) = [s for s in defs.sensors or () if s.name == AUTOMATION_SENSOR]
    assert isinstance(sensor, AutomationConditionSensorDefinition)
    assert sensor.default_status == DefaultSensorStatus.RUNNING
    assert sensor.asset_selection is not None
    assert sensor.asset_selection.resolve(graph) == {revenue.key}


@OWNERS_WARNING
# Dagster's own snapshot of a schedule reads this deprecated property.
@pytest.mark.filterwarnings(
    "ignore:Property `ScheduleDefinition.environment_vars` is deprecated:DeprecationWarning"
)
def test_production_definitions_take_settings_from_env_vars(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    secret = f"pw-{secrets.token_hex(8)}"
    url = f"postgresql://sluice:{secret}@db.invalid:5432/sluice"
    monkeypatch.setenv("DAGSTER_DEPLOYMENT", "production")
    monkeypatch.setenv("SLUICE_PIPELINES", "examples.clickstream,examples.orders")
    monkeypatch.setenv("SLUICE_DATABASE_URL", url)
    monkeypatch.setenv("SLUICE_SPARK_MASTER", "spark://spark-master:7077")
    monkeypatch.setenv("SLUICE_DATA_DIR", str(tmp_path / "data"))
    defs = load_defs()

    # What the UI shows: the variables' names, never their values.
    snap = RepositorySnap.from_def(defs.get_repository_def())
    shown = {r.name: r.configured_values for r in snap.resources}
    assert shown["database"]["url"].name == "SLUICE_DATABASE_URL"
    assert shown["spark"]["master"].name == "SLUICE_SPARK_MASTER"
    assert shown["paths"]["data_dir"].name == "SLUICE_DATA_DIR"
    assert set(snap.utilized_env_vars) >= {
        "SLUICE_DATABASE_URL",
        "SLUICE_SPARK_MASTER",
        "SLUICE_DATA_DIR",
    }
    assert secret not in serialize_value(snap)

    # At run time the resource resolves them (nothing connects: Settings only).
    with build_resources(defs.resources) as resources:
        settings = resources.sluice.settings()
    assert settings.database_url is not None
    assert settings.database_url.get_secret_value() == url
    assert settings.spark_master == "spark://spark-master:7077"
    assert settings.data_dir == tmp_path / "data"


# --------------------------------------------------------------------------- observations


def definitions_of(settings: TestSettings, users: str = "users") -> PipelineDefinitions:
    return pipeline_definitions(own_pipeline(settings, users), settings)


def test_landing_observation_lists_files_without_reading_them(db_url: str, tmp_path: Path) -> None:
    settings = base_settings(db_url, tmp_path, demo_events=60)
    generate_events(settings.landing_path, DemoSpec.from_settings(settings))
    # Not data: a hidden in-flight file, a marker, a file of an unknown kind, a stray folder.
    day = settings.landing_path / "dt=2026-01-01"
    (day / ".part-9.jsonl.tmp").write_text("{}\n")
    (day / "_SUCCESS").write_text("")
    (day / "notes.txt").write_text("x")
    (settings.landing_path / "other").mkdir()
    (settings.landing_path / "other" / "x.jsonl").write_text("{}\n")
    files = list(settings.landing_path.glob("dt=*/part-*.jsonl"))
    assert len(files) == settings.demo_days * settings.demo_files_per_day

    landing, _users = definitions_of(settings).source_assets
    assert landing.key.to_user_string() == f"{settings.source_name}_landing"
    sluice = resource_for(settings)
    result = observe(landing, sluice)
    assert result.success
    metadata, version = observation_metadata(result)
    assert metadata["files"] == len(files)
    assert metadata["total_bytes"] == sum(p.stat().st_size for p in files)
    assert metadata["partitions"] == settings.demo_days
    assert metadata["newest_mtime"] == pytest.approx(max(p.stat().st_mtime for p in files))
    assert metadata["path"] == str(settings.landing_path)
    assert version == list_landing(settings.landing_path).data_version

    # Same files, same version; a new file, a new version.
    assert observation_metadata(observe(landing, sluice))[1] == version
    (settings.landing_path / "dt=2026-01-03").mkdir()
    (settings.landing_path / "dt=2026-01-03" / "part-00000.csv").write_text("event_id\n")
    again, new_version = observation_metadata(observe(landing, sluice))
    assert again["files"] == len(files) + 1
    assert new_version != version


def test_landing_observation_of_a_missing_landing_folder(db_url: str, tmp_path: Path) -> None:
    settings = base_settings(db_url, tmp_path)
    landing, _ = definitions_of(settings).source_assets
    metadata, version = observation_metadata(observe(landing, resource_for(settings)))
    assert (metadata["files"], metadata["total_bytes"]) == (0, 0)
    assert version is not None


def test_lookup_table_observation_reports_the_row_count(db_url: str, tmp_path: Path) -> None:
    settings = base_settings(db_url, tmp_path)
    users = f"users_{secrets.token_hex(3)}"
    _, table = definitions_of(settings, users).source_assets
    assert table.key.path == ["public", users]
    sluice = resource_for(settings)
    missing, missing_version = observation_metadata(observe(table, sluice))
    assert missing["exists"] is False
    assert missing_version == "missing"

    load_user_table(settings, users)
    metadata, version = observation_metadata(observe(table, sluice))
    assert metadata["exists"] is True
    assert metadata["row_count"] == settings.demo_users
    assert metadata["table"] == f"public.{users}"
    assert version is not None and version.startswith(f"rows={settings.demo_users};")


# --------------------------------------------------------------------------- Spark runs


@dataclass(frozen=True)
class Materialized:
    settings: TestSettings
    built: PipelineDefinitions
    instance: DagsterInstance
    enriched: ExecuteInProcessResult

    @property
    def sluice(self) -> SluiceResource:
        return resource_for(self.settings)

    @property
    def name(self) -> str:
        return self.built.pipeline.name

    @property
    def output(self) -> Path:
        return output_path(self.built.pipeline, self.settings)

    def checks_of(
        self, result: ExecuteInProcessResult
    ) -> dict[tuple[str, str | None], AssetCheckEvaluation]:
        """The run's check evaluations by (check name, partition): one per check and day."""
        evaluations = result.get_asset_check_evaluations()
        assert all(e.asset_key == self.built.output.key for e in evaluations)
        by_key = {(e.check_name, e.partition): e for e in evaluations}
        assert len(by_key) == len(evaluations), "two evaluations of one check for one partition"
        return by_key

    def stored_check_status(self, name: str) -> dict[str | None, tuple[str, bool]]:
        """What the instance (and so the UI) holds per partition for a check: latest status
        and whether it checked the partition's latest materialisation."""
        key = AssetCheckKey(self.built.output.key, name)
        return {
            info.partition_key: (info.latest_execution_status.value, info.is_current)
            for info in self.instance.event_log_storage.get_asset_check_partition_info([key])
        }


def run_output(
    built: PipelineDefinitions,
    sluice: SluiceResource,
    instance: DagsterInstance,
    *,
    partition_key: str | None = None,
    tags: Mapping[str, str] | None = None,
) -> ExecuteInProcessResult:
    """The pipeline's output asset and its checks, as a UI launch or backfill runs them."""
    return materialize(
        [built.output, *built.checks],
        partition_key=partition_key,
        tags=tags,
        resources={"sluice": sluice},
        instance=instance,
    )


@pytest.fixture(scope="module")
def materialized(db_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Materialized]:
    """Both days of the pipeline's output in one run."""
    settings = base_settings(db_url, tmp_path_factory.mktemp("assets"))
    users = f"users_{secrets.token_hex(3)}"
    built = pipeline_definitions(own_pipeline(settings, users, "enriched_events"), settings)
    generate_events(settings.landing_path, DemoSpec.from_settings(settings))
    (settings.landing_path / "dt=2026-01-01" / "part-extra.jsonl").write_bytes(EXTRA_FILE)
    load_user_table(settings, users)
    sluice = resource_for(settings)
    with DagsterInstance.ephemeral() as instance:
        enriched = run_output(built, sluice, instance, tags=RANGE_TAGS)
        yield Materialized(settings, built, instance, enriched)


@pytest.mark.spark
def test_a_range_of_partitions_materializes_in_one_run(materialized: Materialized) -> None:
    settings, result = materialized.settings, materialized.enriched
    assert result.success
    events = result.asset_materializations_for_node(materialized.name)
    assert sorted(e.partition or "" for e in events) == DAYS  # one run, both days
    metadata = values(events[0].metadata)
    assert metadata == values(events[1].metadata)  # the run's figures, on each day
    assert set(metadata) >= RUN_METADATA
    assert metadata["pipeline"] == materialized.name
    # Exactly the files of those two days: the demo files plus the extra one.
    assert metadata["splits"] == settings.demo_days * settings.demo_files_per_day + 1
    assert metadata["partitions"] == 2
    assert metadata["partition_range"] == f"{DAYS[0]}..{DAYS[-1]}"
    assert metadata["rows_in"] == metadata["rows_out"] + metadata["dead_letters"]
    assert metadata["dead_letters"] >= 2  # the two malformed lines of the extra file
    assert metadata["lookups"] > 0
    assert metadata["checkpoints_completed"] >= 1
    assert metadata["rows_per_second"] > 0
    assert metadata["output"] == str(materialized.output)
    total = sum(parquet_rows(materialized.output / f"dt={day}") for day in DAYS)
    assert total == metadata["rows_out"]


@pytest.mark.spark
def test_no_password_or_url_in_any_metadata(materialized: Materialized) -> None:
    assert materialized.settings.database_url is not None
    url = materialized.settings.database_url.get_secret_value()
    shown = repr(
        [
            event.event_specific_data
            for event in materialized.enriched.all_events
            if event.event_type_value in ("ASSET_MATERIALIZATION", "ASSET_CHECK_EVALUATION")
        ]
    )
    assert url not in shown
    assert "postgresql://" not in shown
    assert "password" not in shown.lower()


@pytest.mark.spark
def test_checks_pass_on_the_materialized_partitions(materialized: Materialized) -> None:
    """One run over two days: every check reports one result per day, attributed to that
    day's partition and to that day's materialisation."""
    result = materialized.enriched
    checks = materialized.checks_of(result)
    assert set(checks) == {(name, day) for name in CHECKS for day in DAYS}
    assert all(check.passed for check in checks.values()), checks
    events = {e.partition: e for e in result.asset_materializations_for_node(materialized.name)}
    run = values(events[DAYS[0]].metadata)  # the run's figures (on each day's event)
    reconcile = {day: values(checks["rows_reconcile", day].metadata) for day in DAYS}
    for day in DAYS:
        assert reconcile[day]["rows_out"] == parquet_rows(materialized.output / f"dt={day}")
        assert reconcile[day]["rows_out"] == reconcile[day]["rows_committed"]
        assert reconcile[day]["splits_completed"] == reconcile[day]["splits"] > 0
    for figure in ("rows_out", "dead_letters", "splits"):
        assert sum(reconcile[day][figure] for day in DAYS) == run[figure], figure
    assert (
        sum(reconcile[day]["rows_committed"] + reconcile[day]["dead_letters"] for day in DAYS)
        == run["rows_in"]
    )
    # The extra file's malformed lines are day one's: the days' figures differ.
    assert reconcile[DAYS[0]]["dead_letters"] >= 2 and reconcile[DAYS[1]]["dead_letters"] == 0
    for day in DAYS:
        ratio = values(checks["dead_letter_ratio", day].metadata)
        rows_in = reconcile[day]["rows_committed"] + reconcile[day]["dead_letters"]
        assert ratio["rows_in"] == rows_in
        assert ratio["dead_letter_ratio"] == pytest.approx(reconcile[day]["dead_letters"] / rows_in)
        assert values(checks["unique_key", day].metadata)["duplicate_rows"] == 0
        for name in CHECKS:
            target = checks[name, day].target_materialization_data
            assert target is not None and target.run_id == result.run_id
    # What the instance holds: a current, passed result per partition.
    for name in CHECKS:
        assert materialized.stored_check_status(name) == dict.fromkeys(DAYS, ("SUCCEEDED", True))


@pytest.mark.spark
def test_dead_letter_threshold_is_configurable(materialized: Materialized) -> None:
    strict = resource_for(materialized.settings, max_dead_letter_ratio=0.001)
    result = run_output(materialized.built, strict, materialized.instance, partition_key=DAYS[0])
    assert result.success
    checks = materialized.checks_of(result)
    assert set(checks) == {(name, DAYS[0]) for name in CHECKS}
    ratio = checks["dead_letter_ratio", DAYS[0]]
    assert ratio.passed is False
    assert ratio.severity.value == "WARN"
    assert (ratio.description or "").startswith(f"{DAYS[0]}: ")
    assert values(ratio.metadata)["max_dead_letter_ratio"] == 0.001
    assert checks["rows_reconcile", DAYS[0]].passed
    assert checks["unique_key", DAYS[0]].passed


@pytest.mark.spark
def test_dead_letter_threshold_is_a_setting_the_resource_overrides(
    materialized: Materialized, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SLUICE_MAX_DEAD_LETTER_RATIO sets the threshold of `dagster dev`'s checks (which build
    their resource from the environment); a resource's own value wins over it."""
    monkeypatch.setenv("SLUICE_MAX_DEAD_LETTER_RATIO", "0.001")
    from_env = resource_for(materialized.settings)
    result = run_output(materialized.built, from_env, materialized.instance, partition_key=DAYS[0])
    ratio = materialized.checks_of(result)["dead_letter_ratio", DAYS[0]]
    assert ratio.passed is False
    assert values(ratio.metadata)["max_dead_letter_ratio"] == 0.001
    lenient = resource_for(materialized.settings, max_dead_letter_ratio=1.0)
    result = run_output(materialized.built, lenient, materialized.instance, partition_key=DAYS[0])
    ratio = materialized.checks_of(result)["dead_letter_ratio", DAYS[0]]
    assert ratio.passed is True
    assert values(ratio.metadata)["max_dead_letter_ratio"] == 1.0


@pytest.mark.spark
def test_a_corrupt_partition_fails_its_checks_while_the_other_passes(
    materialized: Materialized,
) -> None:
    built, instance, sluice = materialized.built, materialized.instance, materialized.sluice
    good, bad = DAYS
    assert run_output(built, sluice, instance, partition_key=bad).success  # the latest day now
    folder = materialized.output / f"dt={bad}"
    rows = parquet_rows(folder)
    copy = folder / "part-copy-of-a-file.parquet"
    shutil.copyfile(parquet_files(folder)[0], copy)
    copied = pq.read_metadata(copy).num_rows
    checks_only = AssetSelection.checks_for_assets(built.output)
    try:
        # The checks of both days, launched on their own for the range (as from the UI).
        result = materialize(
            [built.output, *built.checks],
            selection=checks_only,
            tags=RANGE_TAGS,
            resources={"sluice": sluice},
            instance=instance,
        )
        assert result.success  # non-blocking checks: the run itself succeeds
        checks = materialized.checks_of(result)
        assert set(checks) == {(name, day) for name in CHECKS for day in DAYS}
        assert all(checks[name, good].passed for name in CHECKS)
        assert not checks["unique_key", bad].passed
        duplicates = values(checks["unique_key", bad].metadata)
        assert duplicates["duplicate_rows"] == copied
        assert duplicates["sample_keys"]
        assert (checks["unique_key", bad].description or "").startswith(f"{bad}: ")
        assert not checks["rows_reconcile", bad].passed
        reconcile = values(checks["rows_reconcile", bad].metadata)
        assert reconcile["rows_out"] == rows + copied
        assert reconcile["rows_committed"] == rows
        assert (checks["rows_reconcile", bad].description or "").startswith(f"{bad}: ")
        assert checks["dead_letter_ratio", bad].passed
        for name in ("unique_key", "rows_reconcile"):
            assert materialized.stored_check_status(name) == {
                good: ("SUCCEEDED", True),
                bad: ("FAILED", True),
            }

        # Checks launched on their own without a partition check the latest materialised day.
        alone = materialize(
            [built.output, *built.checks],
            selection=checks_only,
            resources={"sluice": sluice},
            instance=instance,
        )
        assert alone.success
        assert not alone.asset_materializations_for_node(materialized.name)
        checks = materialized.checks_of(alone)
        assert set(checks) == {(name, bad) for name in CHECKS}
        assert not checks["unique_key", bad].passed
        # ... and with a partition (as the UI launches them), that one.
        one = materialize(
            [built.output, *built.checks],
            selection=checks_only,
            tags={"dagster/partition": good},
            resources={"sluice": sluice},
            instance=instance,
        )
        assert one.success
        assert {key: e.passed for key, e in materialized.checks_of(one).items()} == {
            (name, good): True for name in CHECKS
        }
    except BaseException:
        copy.unlink()
        raise
    # Re-materialising the day replaces its folder: the stray copy goes with the old one.
    again = materialized.checks_of(run_output(built, sluice, instance, partition_key=bad))
    assert not copy.exists() and parquet_rows(folder) == rows
    assert set(again) == {(name, bad) for name in CHECKS}
    assert all(check.passed for check in again.values())
    assert materialized.stored_check_status("rows_reconcile")[bad] == ("SUCCEEDED", True)


def partition_content(folder: Path) -> tuple[int, str]:
    """Row count and a hash of the rows in event-id order (the file layout does not matter)."""
    rows = [row for path in parquet_files(folder) for row in pq.read_table(path).to_pylist()]
    rows.sort(key=lambda row: row["event_id"])
    return len(rows), hashlib.sha256(repr(rows).encode()).hexdigest()


@pytest.mark.spark
def test_re_materialising_a_partition_replaces_it_with_identical_output(
    materialized: Materialized,
) -> None:
    day = DAYS[0]
    folder = materialized.output / f"dt={day}"
    before, files = partition_content(folder), set(parquet_files(folder))
    result = run_output(
        materialized.built, materialized.sluice, materialized.instance, partition_key=day
    )
    assert result.success
    (event,) = result.asset_materializations_for_node(materialized.name)
    metadata = values(event.metadata)
    # Read again from scratch (not a no-op) and swapped in whole.
    assert metadata["rebuilt_partitions"] == day and metadata["nothing_new"] is False
    assert metadata["rows_out"] == before[0]
    assert not files & set(parquet_files(folder))
    assert partition_content(folder) == before
    assert all(check.passed for check in materialized.checks_of(result).values())


# --------------------------------------------------------------------------- a table sink


@pytest.mark.spark
@pytest.mark.parametrize("upsert", [False, True], ids=["append", "upsert"])
def test_checks_of_a_table_sink_per_day(db_url: str, tmp_path: Path, upsert: bool) -> None:
    """The same checks on a Postgres sink: rows out counted in the table by ``dt``, duplicate
    keys found there; an appending sink reconciles row for row, an upsert sink only checks its
    splits (rows merge by key)."""
    settings = base_settings(db_url, tmp_path)
    users = f"users_{secrets.token_hex(3)}"
    table = f"analytics.{settings.source_name}"
    pipeline = demo_pipeline(
        settings,
        table=table,
        steps=[dataclasses.replace(clickstream.steps[0], table=f"public.{users}")],
    )
    if upsert:
        pipeline = dataclasses.replace(
            pipeline, sink=dataclasses.replace(pipeline.sink, upsert_key=["event_id"])
        )
    built = pipeline_definitions(with_start_date(pipeline, settings), settings)
    generate_events(settings.landing_path, DemoSpec.from_settings(settings))
    load_user_table(settings, users)
    sluice = resource_for(settings)
    assert settings.database_url is not None
    engine = sa.create_engine(
        sa.make_url(settings.database_url.get_secret_value()).set(drivername="postgresql+psycopg")
    )
    with DagsterInstance.ephemeral() as instance:
        result = run_output(built, sluice, instance, tags=RANGE_TAGS)
        assert result.success
        checks = {(e.check_name, e.partition): e for e in result.get_asset_check_evaluations()}
        assert {k: e.passed for k, e in checks.items()} == {
            (name, day): True for name in CHECKS for day in DAYS
        }
        with engine.connect() as conn:
            per_day = dict(
                conn.execute(sa.text(f"SELECT dt::text, count(*) FROM {table} GROUP BY 1")).all()
            )
        for day in DAYS:
            reconcile = values(checks["rows_reconcile", day].metadata)
            assert reconcile["rows_out"] == per_day[day] > 0
            assert reconcile["rows_committed"] == per_day[day]
            assert ("note" in reconcile) is upsert

        # A stray copy of a row of day two in the table (not possible with a unique key).
        if not upsert:
            with engine.begin() as conn:
                conn.execute(
                    sa.text(
                        f"INSERT INTO {table} SELECT * FROM {table} "
                        "WHERE dt = :day ORDER BY event_id LIMIT 1"
                    ),
                    {"day": date.fromisoformat(DAYS[1])},
                )
            again = materialize(
                [built.output, *built.checks],
                selection=AssetSelection.checks_for_assets(built.output),
                tags=RANGE_TAGS,
                resources={"sluice": sluice},
                instance=instance,
            )
            passed = {
                (e.check_name, e.partition): e.passed for e in again.get_asset_check_evaluations()
            }
            assert passed == {
                **{(name, DAYS[0]): True for name in CHECKS},
                ("unique_key", DAYS[1]): False,
                ("rows_reconcile", DAYS[1]): False,
                ("dead_letter_ratio", DAYS[1]): True,
                ("no_quarantined_splits", DAYS[1]): True,
            }
    engine.dispose()


# --------------------------------------------------------------------------- refused rebuild


def test_re_materialising_a_day_fed_by_a_half_read_file_fails_clearly(
    db_url: str, tmp_path: Path
) -> None:
    """A day that a file of another landing day fed, while that file is not read to the end
    (a rebuild re-reads it for the day only, so its other days' rows must all be written),
    cannot be re-materialised: the run fails with a Failure naming the day, not retried,
    before anything moved (no Spark session is started)."""
    from dagster_project._runs import discover_once, start_run
    from enumerator_service._schema import SplitStatus, split_partitions, splits

    settings = base_settings(db_url, tmp_path, demo_days=2, demo_files_per_day=1)
    plain = dataclasses.replace(
        demo_pipeline(settings), steps=[], sink=ParquetSink(f"plain_{settings.source_name}")
    )
    pipeline = with_start_date(plain, settings)
    built = pipeline_definitions(pipeline, settings)
    generate_events(settings.landing_path, DemoSpec.from_settings(settings))
    day, other = date(2026, 1, 1), date(2026, 1, 2)
    start_run(settings)
    assert discover_once(settings, pipeline, [day, other]).splits_registered
    engine = sa.create_engine(db_url)
    try:
        with engine.begin() as conn:  # day's file read; other's fed day, then its run died
            ids = dict(
                conn.execute(
                    sa.select(splits.c.partition_key, splits.c.id).where(
                        splits.c.source == pipeline.name
                    )
                ).all()
            )
            conn.execute(
                sa.update(splits)
                .where(splits.c.id == ids[day])
                .values(status=SplitStatus.COMPLETED)
            )
            conn.execute(
                sa.update(splits).where(splits.c.id == ids[other]).values(committed_offset=100)
            )
            conn.execute(
                sa.insert(split_partitions).values(
                    [{"split_id": ids[d], "partition_key": day} for d in (day, other)]
                )
            )
        with DagsterInstance.ephemeral() as instance:
            result = materialize(
                [built.output],
                partition_key=str(day),
                resources={"sluice": resource_for(settings)},
                instance=instance,
                raise_on_error=False,
            )
            assert not result.success
            (failure,) = [e for e in result.all_events if e.event_type_value == "STEP_FAILURE"]
            data = failure.step_failure_data
            assert data.user_failure_data is not None  # a Failure, not a crash
            description = data.user_failure_data.description
            assert description.startswith(
                f"cannot re-materialise: partition {day} of {pipeline.name!r}: file "
            )
            assert description.endswith(
                f"(landing day {other}, unassigned) is not read to the end and may hold rows "
                "of it: run the pipeline to read it first"
            )
            assert values(data.user_failure_data.metadata) == {"partition": str(day)}
            # A refusal, one line: no traceback of its cause in the run's log.
            assert data.error is not None and data.error.cause is None, data.error.cause
            assert not [e for e in result.all_events if e.event_type_value == "STEP_UP_FOR_RETRY"]
        with engine.connect() as conn:  # nothing started, nothing reset, nothing held
            rows = conn.execute(
                sa.select(splits.c.status, splits.c.rebuild_id)
                .where(splits.c.source == pipeline.name)
                .order_by(splits.c.partition_key)
            ).all()
            assert [tuple(row) for row in rows] == [
                (SplitStatus.COMPLETED, None),
                (SplitStatus.UNASSIGNED, None),
            ]
    finally:
        engine.dispose()
