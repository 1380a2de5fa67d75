"""The reporter after a real run: the CLI's bounded run of the demo pipeline over two days
(real Spark, real Postgres) writes its completions in its checkpoints' transactions; the
reporter is killed before its first report, then (restarted) after it and before the mark,
then restarted again — on a real Dagster instance each day is materialised once, every check
of both days passes on the real output, and the live state shows the run's last checkpoint.

No ``__init__.py`` in this folder on purpose (see test_definitions.py).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from datetime import date, datetime
from typing import Any

import pytest
import sqlalchemy as sa
from conftest import TestSettings
from dagster import (
    AssetCheckKey,
    AssetKey,
    AssetRecordsFilter,
    AssetSelection,
    DagsterInstance,
    SensorResult,
    materialize,
)
from dagster_support import demo_definitions, sensor_named, sensor_tick
from demo_platform import demo_discover, demo_run, prepare_demo
from sluice_resource import resource_for

from dagster_project import completions
from dagster_project._counts import partition_counts
from enumerator_service._completeness import END_OF_INPUT
from enumerator_service._completions import unreported_completions
from enumerator_service._live_state import live_state
from enumerator_service._operations import open_platform
from enumerator_service._schema import checkpoints

MakeSettings = Callable[..., TestSettings]
DAYS = [date(2026, 1, 1), date(2026, 1, 2)]


@pytest.mark.spark
def test_a_cli_runs_days_are_reported_once_and_their_checks_pass(
    make_settings: MakeSettings, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = make_settings(demo_events=600, demo_users=200)
    platform = open_platform(settings)
    try:
        prepare_demo(settings, platform)
        demo_discover(platform)
        summary = demo_run(settings)
        assert summary.rows_out > 0
        built = demo_definitions(settings)
        with platform.engine.connect() as conn:
            last = conn.execute(
                sa.select(sa.func.max(checkpoints.c.checkpoint_id)).where(
                    checkpoints.c.run_id == summary.run_id
                )
            ).scalar_one()
        # The bounded run completed its days at end of input, in its checkpoints' transactions.
        recorded = {
            c.partition_key: c
            for c in unreported_completions(platform.engine, built.pipeline.name, limit=100)
        }
        assert sorted(recorded) == DAYS
        for counts in partition_counts(built.pipeline, settings, DAYS):
            assert counts.day is not None and counts.rows_committed > 0
            completion = recorded[counts.day]
            assert (completion.generation, completion.run_id) == (1, summary.run_id)
            assert completion.rows == counts.rows_committed
        sluice = resource_for(settings)
        with DagsterInstance.ephemeral() as instance:
            sensor = sensor_named(built, "report_completions")
            # The reporter dies before its first report, then (restarted) after its first
            # report and before the mark: the rows the run wrote are reported once each.
            for step, dies in (
                ("before the report", "completion_materialization"),
                ("before the mark", "mark_reported"),
            ):
                with monkeypatch.context() as patch:
                    patch.setattr(completions, dies, _dies(step))
                    with pytest.raises(SystemExit, match=step):
                        sensor_tick(sensor, sluice, instance=instance)
                reported = _materialized(instance, built.output.key)
                assert reported == ({} if dies == "completion_materialization" else {DAYS[0]: 1})
                assert len(unreported_completions(platform.engine, built.pipeline.name, 100)) == 2
            result, _ = sensor_tick(sensor, sluice, instance=instance)
            assert _materialized(instance, built.output.key) == dict.fromkeys(DAYS, 1)
            assert unreported_completions(platform.engine, built.pipeline.name, 100) == []
            assert isinstance(result, SensorResult)
            requests = list(result.run_requests or [])
            assert [r.tags["dagster/partition"] for r in requests] == [d.isoformat() for d in DAYS]
            assert instance.get_materialized_partitions(built.output.key) == {
                d.isoformat() for d in DAYS
            }
            for request in requests:  # as the daemon launches them
                run = materialize(
                    [built.output, *built.checks],
                    selection=AssetSelection.checks(*(request.asset_check_keys or [])),
                    tags=request.tags,
                    resources={"sluice": sluice},
                    instance=instance,
                )
                assert run.success
                evaluations = run.get_asset_check_evaluations()
                assert {e.check_name for e in evaluations} == {
                    key.name for check in built.checks for key in check.check_keys
                }
                assert all(e.passed for e in evaluations), evaluations
                assert {e.partition for e in evaluations} == {request.tags["dagster/partition"]}
            # Ticking again reports nothing twice.
            again, _ = sensor_tick(sensor, sluice, instance=instance)
            assert not isinstance(again, SensorResult)
            assert _materialized(instance, built.output.key) == dict.fromkeys(DAYS, 1)
            for day in DAYS:
                key = AssetCheckKey(built.output.key, "rows_reconcile")
                history = instance.event_log_storage.get_asset_check_execution_history(key, 10)
                assert [h.partition for h in history].count(day.isoformat()) == 1
        with platform.engine.connect() as conn:
            state = live_state(conn, built.pipeline.name, summary_end(conn, summary.run_id))
        assert state.run_id == summary.run_id and state.checkpoint_id == last
        assert state.backlog_splits == 0
        # The bounded run read every split: its run watermark is +infinity.
        assert state.watermark == END_OF_INPUT and state.watermark_lag_seconds == 0.0
        assert state.last_checkpoint_seconds is not None and state.last_checkpoint_seconds >= 0
    finally:
        platform.close()


def _dies(step: str) -> Callable[..., Any]:
    def die(*args: Any) -> Any:
        raise SystemExit(f"reporter killed {step}")

    return die


def _materialized(instance: DagsterInstance, key: AssetKey) -> dict[date, int]:
    """Materialisations of ``key`` in the event log, per partition."""
    records = instance.fetch_materializations(AssetRecordsFilter(asset_key=key), limit=100)
    return dict(Counter(date.fromisoformat(r.partition_key or "") for r in records.records))


def summary_end(conn: sa.Connection, run_id: str) -> datetime:
    """The run's last checkpoint's completion time (the clock of the live state)."""
    end: datetime = conn.execute(
        sa.select(sa.func.max(checkpoints.c.completed_at)).where(checkpoints.c.run_id == run_id)
    ).scalar_one()
    return end
