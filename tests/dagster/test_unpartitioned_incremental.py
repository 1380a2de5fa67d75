"""An unpartitioned pipeline's incremental job (what its schedule and sensor run) materialises
its output asset: a CDC source replicated into a Postgres upsert sink by runs of
``<pipeline>_incremental`` — each is a materialisation of the asset in Dagster's history, with
its run's counts and its checks' evaluations, and the sink equals the table after each; a CDC
pipeline has no new-files sensor. A run that processed no split (a table source with no new
rows) succeeds without a materialisation: the output is as before.

(A day-partitioned pipeline's incremental job stays an op job whose days are reported by the
completions sensor: ``test_definitions``, ``test_completions``.)
"""

from __future__ import annotations

import secrets
from typing import Any

import pytest
import sqlalchemy as sa
from cdc_oracle import cdc_pipeline, compare, create_table, rows_of
from conftest import TestSettings
from dagster import AssetKey, DagsterEventType, DagsterInstance
from dagster_support import incremental_job_of
from sluice_resource import resource_for

from dagster_project._factory import pipeline_definitions
from enumerator_service._operations import open_platform
from spark_jobs import ParquetSink, Pipeline, TableSource
from spark_jobs.connectors.postgres_cdc import drop_slot

pytestmark = pytest.mark.spark


def _materializations(instance: DagsterInstance, key: AssetKey) -> list[dict[str, Any]]:
    records = instance.fetch_materializations(key, limit=10).records
    return [
        {name: value.value for name, value in record.asset_materialization.metadata.items()}
        for record in records
        if record.asset_materialization is not None
    ]


def _checks_passed(instance: DagsterInstance, run_id: str) -> dict[str, bool]:
    records = instance.all_logs(run_id, of_type=DagsterEventType.ASSET_CHECK_EVALUATION)
    outcomes = {}
    for record in records:
        event = record.get_dagster_event()
        assert event is not None
        data = event.event_specific_data
        outcomes[data.check_name] = data.passed
    return outcomes


def test_each_incremental_run_of_a_cdc_pipeline_is_a_materialisation(
    make_settings: Any,
) -> None:
    settings: TestSettings = make_settings()
    platform = open_platform(settings)
    table = f"public.cdc_{secrets.token_hex(3)}"
    pipeline = cdc_pipeline(f"flatcdc_{secrets.token_hex(3)}", table)
    slot = pipeline.plan.source.options.slot
    built = pipeline_definitions(pipeline, settings)
    assert built.output.partitions_def is None
    # A stream source has no new-files sensor (changes are not splits discovery finds).
    assert {s.name.removeprefix(pipeline.name) for s in built.sensors} == {
        "_continuous",
        "_report_completions",
        "_live_state",
    }
    job = incremental_job_of(built, settings)
    key = built.output.key
    try:
        create_table(platform.engine, table, rows=100)
        resources = {"sluice": resource_for(settings)}
        with DagsterInstance.ephemeral() as instance:
            first = job.execute_in_process(resources=resources, instance=instance)
            assert first.success
            assert compare(
                rows_of(platform.engine, table), rows_of(platform.engine, f"{table}_out")
            ).equal
            with platform.engine.begin() as conn:  # changes for the next scheduled run
                conn.execute(sa.text(f"UPDATE {table} SET n = n + 1000 WHERE id <= 10"))
                conn.execute(sa.text(f"DELETE FROM {table} WHERE id BETWEEN 11 AND 15"))
                conn.execute(
                    sa.text(
                        f"INSERT INTO {table} SELECT g, 'late', g FROM generate_series(101, 120) g"
                    )
                )
            second = job.execute_in_process(resources=resources, instance=instance)
            assert second.success
            diff = compare(
                rows_of(platform.engine, table), rows_of(platform.engine, f"{table}_out")
            )
            assert diff.equal, str(diff)
            # Nothing changed since:
            third = job.execute_in_process(resources=resources, instance=instance)
            assert third.success
            # A stream split read to the slot's end: the output is current as of this run.
            latest, newest, oldest = _materializations(instance, key)
            assert latest["splits"] == 1 and latest["rows_out"] == 0
            assert oldest["rows_out"] == 100  # the snapshot's chunks
            assert newest["rows_out"] == 10 + 5 + 20  # the changes, deletes included
            # Its discovery counts chunks and a stream, not files: no file-only figures.
            assert {"files_seen", "skipped_links", "skipped_names"}.isdisjoint(latest)
            assert latest["splits_registered"] == 1
            for run in (first, second):
                outcomes = _checks_passed(instance, run.run_id)
                assert outcomes and all(outcomes.values()), outcomes
                assert {"unique_key", "rows_reconcile"} <= outcomes.keys()
    finally:
        drop_slot(platform.engine, slot, slot)
        platform.close()


def test_a_run_that_processed_no_split_is_no_materialisation(make_settings: Any) -> None:
    settings: TestSettings = make_settings()
    platform = open_platform(settings)
    table = f"public.flat_{secrets.token_hex(3)}"
    pipeline = Pipeline(
        name=f"flattable_{secrets.token_hex(3)}",
        source=TableSource(table, key="id", schema={"id": "int64", "v": "string"}),
        sink=ParquetSink(f"flat_{secrets.token_hex(3)}"),
    )
    built = pipeline_definitions(pipeline, settings)
    assert any(s.name == f"{pipeline.name}_new_files" for s in built.sensors)
    job = incremental_job_of(built, settings)
    try:
        with platform.engine.begin() as conn:
            conn.execute(sa.text(f"CREATE TABLE {table} (id bigint PRIMARY KEY, v text)"))
            conn.execute(
                sa.text(f"INSERT INTO {table} SELECT g, 'x' FROM generate_series(1, 50) g")
            )
        resources = {"sluice": resource_for(settings)}
        with DagsterInstance.ephemeral() as instance:
            runs = [
                job.execute_in_process(resources=resources, instance=instance) for _ in range(2)
            ]
            assert all(run.success for run in runs)
            (only,) = _materializations(instance, built.output.key)
            assert only["rows_out"] == 50 and only["run_id"].endswith(runs[0].run_id)
            skipped = [e for e in runs[1].all_events if e.event_type_value == "STEP_SKIPPED"]
            assert skipped  # the checks of an output that did not change
    finally:
        with platform.engine.begin() as conn:
            conn.execute(sa.text(f"DROP TABLE IF EXISTS {table}"))
        platform.close()
