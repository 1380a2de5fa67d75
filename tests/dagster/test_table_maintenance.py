"""The table maintenance jobs the Dagster factory builds for a lakehouse sink
(``dagster_project.maintenance``), run against a real Iceberg table.

A test-only sink connector, written and registered here as a connector outside the platform
is (``register_sink`` with a spec type of its own, see ``docs/contributing``): the Parquet
sink's behaviour plus ``maintenance``, which returns ``IcebergMaintenance`` of an Iceberg
table this test made (SQL catalog on the test Postgres, warehouse in ``tmp_path``). No Spark
run: a completed day is what the completion reporter leaves in Dagster — a runless
materialisation of the output's partition — and the sensor, the schedule and the jobs are
called directly (``build_sensor_context``, ``evaluate_tick``, ``execute_in_process``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import date
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from dagster import (
    AssetMaterialization,
    DagsterInstance,
    DynamicPartitionsDefinition,
    SensorResult,
    SkipReason,
    build_schedule_context,
    build_sensor_context,
)
from lakehouse_tables import (
    DAYS,
    assert_same_rows,
    iceberg_catalog,
    iceberg_rows,
    make_iceberg_table,
)
from sluice_resource import resource_for

from dagster_project import pipeline_definitions
from enumerator_service import Settings
from spark_jobs import ParquetSink, Pipeline
from spark_jobs.connectors import TableMaintenance, register_sink
from spark_jobs.connectors.iceberg._maintenance import COMPACTION_PROPERTY, IcebergMaintenance
from spark_jobs.connectors.parquet import ParquetConnector
from tests.connectors.generator import GeneratorSource
from tests.connectors.generator_pipeline import generated

#: Pipeline name → (warehouse URI, table identifier) of the Iceberg table its sink maintains.
_TABLES: dict[str, tuple[str, str]] = {}


@dataclass(frozen=True)
class MaintainedSink(ParquetSink):
    """A Parquet sink whose table also has lakehouse maintenance (test only)."""


class MaintainedConnector(ParquetConnector):
    name = "maintained_parquet"

    def maintenance(
        self, engine: sa.Engine, pipeline: Pipeline, settings: Settings
    ) -> TableMaintenance | None:
        warehouse, identifier = _TABLES[pipeline.name]
        assert settings.database_url is not None
        catalog = iceberg_catalog(settings.database_url.get_secret_value(), warehouse)
        return IcebergMaintenance(catalog.load_table(identifier), engine)


register_sink(MaintainedSink, MaintainedConnector())

maintained = Pipeline(
    name="maintained",
    source=GeneratorSource(first_day=DAYS[0].isoformat(), days=2, per_day=100),
    sink=MaintainedSink(),
    key=["event_id"],
)


def _config(retention: float, grace: float) -> dict[str, Any]:
    op = f"{maintained.name}_expire_and_remove_orphans"
    return {"ops": {op: {"config": {"retention_hours": retention, "grace_hours": grace}}}}


def test_a_parquet_pipeline_gets_no_maintenance(make_settings: Any) -> None:
    built = pipeline_definitions(generated, make_settings())
    assert built.maintenance_jobs == []
    assert not any("compact" in s.name for s in built.sensors)
    assert [s.name for s in built.schedules] == [f"{generated.name}_schedule"]


@pytest.mark.parametrize("partitions", ["daily", "discovered"])
def test_a_completed_day_is_compacted_and_the_daily_job_expires_and_sweeps(
    make_settings: Any, db_url: str, tmp_path: Path, partitions: str
) -> None:
    settings = make_settings(dagster_partitions=partitions)
    warehouse = f"file://{tmp_path}/iceberg"
    table, oracle = make_iceberg_table(iceberg_catalog(db_url, warehouse), 4)
    _TABLES[maintained.name] = (warehouse, ".".join(table.name()))
    day: date = DAYS[0]

    built = pipeline_definitions(maintained, settings)
    jobs = {job.name: job for job in built.jobs}
    compact = jobs["maintained_compact"]
    dynamic = isinstance(compact.partitions_def, DynamicPartitionsDefinition)
    assert dynamic == (partitions == "discovered")
    expire = jobs["maintained_table_maintenance"]
    [sensor] = [s for s in built.sensors if s.name == "maintained_compact_completed_days"]
    [schedule] = [s for s in built.schedules if s.name == "maintained_table_maintenance_schedule"]
    resources = {"sluice": resource_for(settings)}

    with DagsterInstance.ephemeral() as instance:
        # Nothing complete yet: no run.
        assert isinstance(sensor(build_sensor_context(instance=instance)), SkipReason)
        # What the completion reporter does: the day is a partition (discovered: added by
        # sync_partitions), then its runless materialisation.
        if partitions == "discovered":
            instance.add_dynamic_partitions(f"{maintained.name}_days", [day.isoformat()])
        for _ in range(3):  # reported, then rebuilt twice before the sensor's tick
            instance.report_runless_asset_event(
                AssetMaterialization(asset_key=built.output.key, partition=day.isoformat())
            )
        tick = sensor(build_sensor_context(instance=instance))
        assert isinstance(tick, SensorResult)
        [request] = tick.run_requests or []
        assert request.partition_key == day.isoformat()
        # The cursor moved past it: the next tick requests nothing again.
        again = sensor(build_sensor_context(instance=instance, cursor=tick.cursor))
        assert isinstance(again, SkipReason)

        run = compact.execute_in_process(
            partition_key=request.partition_key, resources=resources, instance=instance
        )
        assert run.success
        metadata = _step_metadata(run, f"{maintained.name}_compact_day")
        assert (metadata["files_before"], metadata["files_after"]) == (4, 1)
        assert metadata["rows"] == sum(1 for row in oracle if row[1] == day)

        table.refresh()
        current = table.current_snapshot()
        assert current is not None and current.summary is not None
        assert current.summary[COMPACTION_PROPERTY] == day.isoformat()
        found, paths = iceberg_rows(table)
        assert_same_rows(found, oracle)
        assert len(paths) == 5  # 4 files of the day → 1, the other day's 4

        # The daily schedule's run: retention 0 and grace 0 leave the current snapshot and
        # its files only (a stray file of a failed attempt goes too).
        [scheduled] = (
            schedule.evaluate_tick(build_schedule_context(instance=instance)).run_requests or []
        )
        assert scheduled.job_name in (None, expire.name)
        stray = Path(table.location().removeprefix("file://")) / "data" / f"dt={day}" / "x.parquet"
        stray.write_bytes(b"PAR1 not committed")
        time.sleep(0.01)
        swept = expire.execute_in_process(
            run_config=_config(0.0, 0.0), resources=resources, instance=instance
        )
        assert swept.success
        metadata = _step_metadata(swept, f"{maintained.name}_expire_and_remove_orphans")
        assert (metadata["snapshots_before"], metadata["snapshots_after"]) == (9, 1)
        assert metadata["orphans_removed"] == 5  # the day's 4 compacted files + the stray
        assert not stray.exists()
        table.refresh()
        assert len(table.metadata.snapshots) == 1
        assert_same_rows(iceberg_rows(table)[0], oracle)


def test_a_negative_grace_is_refused_by_the_run_config(make_settings: Any) -> None:
    settings = make_settings()
    built = pipeline_definitions(maintained, settings)
    [expire] = [job for job in built.jobs if job.name == "maintained_table_maintenance"]
    # Dagster's config schema has no bounds: the op's config model refuses it when the op
    # starts, before the table is opened.
    result = expire.execute_in_process(
        run_config=_config(1.0, -1.0),
        resources={"sluice": resource_for(settings)},
        raise_on_error=False,
    )
    assert not result.success
    [failure] = result.get_step_failure_events()
    error = failure.step_failure_data.error
    messages = []
    while error is not None:
        messages.append(error.message)
        error = error.cause
    assert any("grace_hours" in m and "greater than or equal to 0" in m for m in messages), messages


def _step_metadata(result: Any, step: str) -> dict[str, Any]:
    """The plain values of ``step``'s output metadata."""
    for event in result.all_node_events:
        if event.step_key == step and event.is_successful_output:
            data = event.event_specific_data.metadata
            return {key: getattr(value, "value", value) for key, value in data.items()}
    raise AssertionError(f"no output of {step}")
