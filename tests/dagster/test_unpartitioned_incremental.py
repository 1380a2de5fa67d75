"""An unpartitioned pipeline's incremental job (what its schedule and sensor run) materialises
its output asset: a CDC source replicated into a Postgres upsert sink by two runs of
``<pipeline>_incremental`` — each is a materialisation of the asset in Dagster's history, with
its run's counts and its checks' evaluations, and the sink equals the table after each.

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
    job = incremental_job_of(built, settings)
    key = built.output.key
    try:
        create_table(platform.engine, table, rows=100)
        with DagsterInstance.ephemeral() as instance:
            first = job.execute_in_process(
                resources={"sluice": resource_for(settings)}, instance=instance
            )
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
            second = job.execute_in_process(
                resources={"sluice": resource_for(settings)}, instance=instance
            )
            assert second.success
            diff = compare(
                rows_of(platform.engine, table), rows_of(platform.engine, f"{table}_out")
            )
            assert diff.equal, str(diff)
            newest, oldest = _materializations(instance, key)
            assert oldest["rows_out"] == 100  # the snapshot's chunks
            assert newest["rows_out"] == 10 + 5 + 20  # the changes, deletes included
            for run in (first, second):
                outcomes = _checks_passed(instance, run.run_id)
                assert outcomes and all(outcomes.values()), outcomes
                assert {"unique_key", "rows_reconcile"} <= outcomes.keys()
    finally:
        drop_slot(platform.engine, slot, slot)
        platform.close()
