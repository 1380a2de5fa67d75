"""Completed partitions reported to Dagster exactly once per partition and generation, with
their checks: real Dagster instance, real sensor contexts, real Postgres, the checks' runs
the sensor requests executed in process (as the daemon launches them). Completion rows are
inserted directly, as the checkpoint commit of the completeness part writes them.

No ``__init__.py`` in this folder on purpose (see test_definitions.py).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from datetime import date, timedelta
from typing import Any

import pytest
from completions_support import create_completions_table, insert_completion, reported_at
from conftest import TestSettings
from dagster import (
    AssetCheckKey,
    AssetKey,
    AssetRecordsFilter,
    AssetSelection,
    DagsterInstance,
    DagsterRun,
    DagsterRunStatus,
    DailyPartitionsDefinition,
    Definitions,
    DynamicPartitionsDefinition,
    MaterializeResult,
    RunRequest,
    SensorResult,
    SkipReason,
    asset,
    build_sensor_context,
    materialize,
)
from dagster._core.utils import make_new_run_id
from dagster_support import demo_definitions, sensor_named, sensor_tick
from hypothesis import HealthCheck, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st
from rich.console import Console
from sluice_resource import resource_for

import dagster_project.completions as completions
from dagster_project import PipelineDefinitions
from enumerator_service import FileSplit, SplitStore
from enumerator_service._completions import CompletionCounts
from enumerator_service._operations import (
    Platform,
    PlatformStatus,
    open_platform,
    platform_status,
)
from spark_jobs.cli._render import status_table

MakeSettings = Callable[..., TestSettings]
DAYS = [date(2026, 1, 1), date(2026, 1, 2), date(2026, 1, 3)]
CHECKS = ["unique_key", "rows_reconcile", "dead_letter_ratio", "no_quarantined_splits"]


class Reporting:
    def __init__(self, settings: TestSettings, platform: Platform, instance: DagsterInstance):
        self.settings, self.platform, self.instance = settings, platform, instance
        self.built: PipelineDefinitions = demo_definitions(settings)
        self.key: AssetKey = self.built.output.key
        self.source = self.built.pipeline.name
        #: The last tick's skip message (None: it requested runs).
        self.skipped: str | None = None
        #: Hypothesis examples run on this instance so far.
        self.examples = 0

    def tick(self) -> list[RunRequest]:
        """One tick; the checks' runs it requests (a skipped tick: none)."""
        sensor = sensor_named(self.built, "report_completions")
        result, _ = sensor_tick(sensor, resource_for(self.settings), instance=self.instance)
        if isinstance(result, SkipReason):
            self.skipped = result.skip_message
            return []
        self.skipped = None
        assert isinstance(result, SensorResult)
        return list(result.run_requests or [])

    def run_checks(self, requests: list[RunRequest]) -> None:
        """Each requested run, as the daemon would launch it (once per run key)."""
        for request in requests:
            assert request.asset_selection == []
            result = materialize(
                [self.built.output, *self.built.checks],
                selection=AssetSelection.checks(*(request.asset_check_keys or [])),
                tags=request.tags,
                resources={"sluice": resource_for(self.settings)},
                instance=self.instance,
            )
            assert result.success

    def complete(self, day: date, generation: int = 1, **fields: Any) -> None:
        insert_completion(self.platform.engine, self.source, day, generation, **fields)

    def materializations(self, day: date) -> list[Any]:
        records = self.instance.fetch_materializations(
            AssetRecordsFilter(asset_key=self.key, asset_partitions=[day.isoformat()]), limit=100
        ).records
        return [r.asset_materialization for r in records]

    def checks_of(self, day: date) -> dict[str, Any]:
        """Each check's latest evaluation of ``day``."""
        found = {}
        for check in self.built.checks:
            for key in check.check_keys:
                history = self.instance.event_log_storage.get_asset_check_execution_history(
                    AssetCheckKey(self.key, key.name), limit=100
                )
                mine = [h for h in history if h.partition == day.isoformat()]
                if mine:
                    found[key.name] = mine[0]
        return found


@pytest.fixture
def reporting(make_settings: MakeSettings) -> Iterator[Reporting]:
    settings = make_settings()
    platform = open_platform(settings)
    create_completions_table(platform.engine)
    try:
        with DagsterInstance.ephemeral() as instance:
            yield Reporting(settings, platform, instance)
    finally:
        platform.close()


def test_each_completed_partition_is_reported_once_with_its_checks(reporting: Reporting) -> None:
    assert reporting.tick() == []
    assert reporting.skipped == "no newly complete partition"
    for day in DAYS:
        reporting.complete(day)
    reporting.complete(DAYS[0], generation=2)
    assert status_of(reporting).completions == CompletionCounts(3, 4, 4)
    requests = reporting.tick()
    # In the order they completed (generation 2 of day 1 before day 2 completed); every
    # generation is reported, but only a day's last one is checked (its output as it is now).
    assert [r.run_key.removeprefix(reporting.source) for r in requests] == [
        ":checks:2026-01-01:g2",
        ":checks:2026-01-02:g1",
        ":checks:2026-01-03:g1",
    ]
    assert status_of(reporting).completions == CompletionCounts(3, 4, 0)
    text = status_text(status_of(reporting))
    assert "partitions complete" in text and "3, 1 completed again" in text
    assert reporting.instance.get_materialized_partitions(reporting.key) == {
        d.isoformat() for d in DAYS
    }
    (event,) = reporting.materializations(DAYS[1])
    assert event.tags == {
        "sluice/source": reporting.source,
        "sluice/partition": "2026-01-02",
        "sluice/generation": "1",
    }
    metadata = {k: v.value for k, v in event.metadata.items()}
    assert metadata["rows"] == 100 and metadata["dead_letters"] == 2
    assert metadata["late_records"] == 0 and metadata["generation"] == 1
    assert metadata["run_id"] == "run-1" and metadata["checkpoint_id"] == 3
    assert metadata["watermark"] == pytest.approx(1767398401.0)  # 2026-01-03T00:00:01Z
    assert all(
        when is not None
        for when in reported_at(reporting.platform.engine, reporting.source).values()
    )
    reporting.run_checks(requests)
    for day in DAYS:
        checks = reporting.checks_of(day)
        assert set(checks) == set(CHECKS)
        assert all(c.status.value == "SUCCEEDED" for c in checks.values()), checks
        # Each evaluation checked the reported materialisation.
        (record,) = reporting.instance.fetch_materializations(
            AssetRecordsFilter(asset_key=reporting.key, asset_partitions=[day.isoformat()]),
            limit=1,
        ).records
        targets = {
            c.event.dagster_event.event_specific_data.target_materialization_data.storage_id
            for c in checks.values()
        }
        assert targets == {record.storage_id}
    # A second tick reports nothing again.
    assert reporting.tick() == []
    assert [len(reporting.materializations(day)) for day in DAYS] == [2, 1, 1]


def test_a_crash_after_the_report_and_before_the_mark_is_not_reported_twice(
    reporting: Reporting, monkeypatch: pytest.MonkeyPatch
) -> None:
    reporting.complete(DAYS[0])

    def crash(*args: Any) -> bool:
        raise SystemExit("killed between the report and the mark")

    monkeypatch.setattr(completions, "mark_reported", crash)
    with pytest.raises(SystemExit):
        reporting.tick()
    assert len(reporting.materializations(DAYS[0])) == 1
    assert reported_at(reporting.platform.engine, reporting.source) == {(DAYS[0], 1): None}
    monkeypatch.undo()
    # Only marked, and its checks' run requested again under the same run key (Dagster
    # launches a run key once).
    (request,) = reporting.tick()
    assert request.run_key == f"{reporting.source}:checks:2026-01-01:g1"
    assert len(reporting.materializations(DAYS[0])) == 1
    assert reported_at(reporting.platform.engine, reporting.source)[DAYS[0], 1] is not None
    assert reporting.tick() == []


def test_a_crash_before_the_report_reports_after_restart(
    reporting: Reporting, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Committed in Postgres, the reporter died before Dagster heard: the next tick reports."""
    reporting.complete(DAYS[1])

    def crash(*args: Any) -> None:
        raise SystemExit("killed before the report")

    monkeypatch.setattr(completions, "completion_materialization", crash)
    with pytest.raises(SystemExit):
        reporting.tick()
    assert reporting.materializations(DAYS[1]) == []
    monkeypatch.undo()
    (request,) = reporting.tick()
    assert request.tags["dagster/partition"] == "2026-01-02"
    assert len(reporting.materializations(DAYS[1])) == 1


def test_a_reopened_partition_is_reported_again_once_per_generation(reporting: Reporting) -> None:
    reporting.complete(DAYS[0])
    reporting.run_checks(reporting.tick())
    reporting.complete(DAYS[0], generation=2)
    requests = reporting.tick()
    assert [r.run_key for r in requests] == [f"{reporting.source}:checks:2026-01-01:g2"]
    assert reporting.tick() == []
    events = reporting.materializations(DAYS[0])
    assert [e.tags["sluice/generation"] for e in events] == ["2", "1"]  # newest first
    assert {k: v.value for k, v in events[0].metadata.items()}["late_records"] == 1
    # The generation's checks run again, against the new materialisation.
    reporting.run_checks(requests)
    (latest, _) = reporting.instance.fetch_materializations(
        AssetRecordsFilter(asset_key=reporting.key, asset_partitions=["2026-01-01"]), limit=2
    ).records
    checks = reporting.checks_of(DAYS[0])
    assert all(c.status.value == "SUCCEEDED" for c in checks.values())
    assert {
        c.event.dagster_event.event_specific_data.target_materialization_data.storage_id
        for c in checks.values()
    } == {latest.storage_id}


def test_dagster_resolves_the_checks_run_request(reporting: Reporting) -> None:
    """The sensor's run requests are valid for its target, as the daemon resolves them (a
    checks-only run of one partition of the output)."""
    reporting.complete(DAYS[2])
    sensor = sensor_named(reporting.built, "report_completions")
    definitions = Definitions(
        assets=[reporting.built.output],
        asset_checks=reporting.built.checks,
        sensors=[sensor],
        resources={"sluice": resource_for(reporting.settings)},
    )
    with build_sensor_context(
        instance=reporting.instance,
        definitions=definitions,
        resources={"sluice": resource_for(reporting.settings)},
    ) as context:
        data = sensor.evaluate_tick(context)
    (request,) = data.run_requests or []
    assert request.run_key == f"{reporting.source}:checks:2026-01-03:g1"
    assert request.tags["dagster/partition"] == "2026-01-03"
    assert request.tags[completions.CHECKS_TAG] == reporting.source  # (one at a time per pipeline)
    assert set(request.asset_check_keys or []) == {
        key for check in reporting.built.checks for key in check.check_keys
    }
    job = definitions.resolve_implicit_global_asset_job_def()
    assert job.partitions_def is not None


def test_discovered_partitions_are_the_days_with_input(make_settings: MakeSettings) -> None:
    """``SLUICE_DAGSTER_PARTITIONS=discovered``: the output's partitions are the days that
    have splits or completions, added by the reporter's tick (in date order), not every day
    since a start date; the checks' run of a reported day runs on that dynamic partition."""
    settings = make_settings(dagster_partitions="discovered")
    platform = open_platform(settings)
    create_completions_table(platform.engine)
    try:
        with DagsterInstance.ephemeral() as instance:
            reporting = Reporting(settings, platform, instance)
            partitions = reporting.built.partitions
            assert isinstance(partitions, DynamicPartitionsDefinition)
            assert partitions.name == f"{reporting.source}_days"
            assert {c.partitions_def for c in reporting.built.checks} == {partitions}
            folder = settings.landing_path
            SplitStore(platform.engine).register(
                [
                    FileSplit(reporting.source, "jsonl", f"{folder}/dt={day}/a.jsonl", 0, None, day)
                    for day in (DAYS[2], DAYS[0])
                ]
            )
            # A landing folder with a data file nothing registered yet is a day too (it can
            # be launched); an empty one is not.
            (folder / "dt=2026-01-09").mkdir(parents=True)
            (folder / "dt=2026-01-08").mkdir()
            (folder / "dt=2026-01-08" / "b.jsonl").write_text("{}\n")
            assert reporting.tick() == []
            assert instance.get_dynamic_partitions(partitions.name) == [
                "2026-01-01",
                "2026-01-03",
                "2026-01-08",
            ]
            reporting.complete(DAYS[1])  # a day completed with no split left (e.g. pruned)
            requests = reporting.tick()
            assert instance.get_dynamic_partitions(partitions.name) == [
                "2026-01-01",
                "2026-01-03",
                "2026-01-08",
                "2026-01-02",
            ]
            assert instance.get_materialized_partitions(reporting.key) == {"2026-01-02"}
            reporting.run_checks(requests)
            assert set(reporting.checks_of(DAYS[1])) == set(CHECKS)
    finally:
        platform.close()


def test_daily_partitions_start_at_the_pipelines_start_date(reporting: Reporting) -> None:
    """``SLUICE_DAGSTER_PARTITIONS=daily`` (the tests' setting, see conftest)."""
    assert isinstance(reporting.built.partitions, DailyPartitionsDefinition)
    assert reporting.built.partitions.get_first_partition_key() == "2026-01-01"


def test_a_day_its_own_asset_run_materialised_is_not_reported_again(
    reporting: Reporting,
) -> None:
    """A launch or backfill of the output asset materialises the days it completes itself:
    once it succeeded the reporter only marks them; while it runs they wait."""
    partitions = reporting.built.partitions

    @asset(name=reporting.source, partitions_def=partitions)
    def stand_in() -> MaterializeResult[None]:  # the output asset's run, without Spark
        return MaterializeResult(metadata={"rows_out": 100})

    result = materialize([stand_in], partition_key=DAYS[0].isoformat(), instance=reporting.instance)
    reporting.complete(DAYS[0], run_id=f"dagster-{result.run_id}")
    running = DagsterRun(
        job_name="__ASSET_JOB",
        run_id=make_new_run_id(),
        status=DagsterRunStatus.STARTED,
        asset_selection=frozenset({reporting.key}),
    )
    reporting.instance.add_run(running)
    reporting.complete(DAYS[1], run_id=f"dagster-{running.run_id}")

    assert reporting.tick() == []
    assert reporting.skipped == "no completion to check (see the tick's log)"
    assert len(reporting.materializations(DAYS[0])) == 1  # the run's own
    assert reporting.materializations(DAYS[1]) == []
    marks = reported_at(reporting.platform.engine, reporting.source)
    assert marks[DAYS[0], 1] is not None and marks[DAYS[1], 1] is None
    # The run fails after its commit: the day is reported like any other.
    reporting.instance.report_run_failed(running)
    (request,) = reporting.tick()
    assert request.tags["dagster/partition"] == "2026-01-02"
    assert len(reporting.materializations(DAYS[1])) == 1


#: One step of a reporter's life: a checkpoint completes a day (its next generation), or a
#: tick runs to its end, or dies after its report and before the mark, or before its report.
Step = tuple[str, int]
CRASHES = {
    "crash_before_mark": "mark_reported",
    "crash_before_report": "completion_materialization",
}
STEPS = st.one_of(
    st.tuples(st.just("complete"), st.integers(0, 2)),
    st.tuples(st.sampled_from(["tick", "crash_before_mark", "crash_before_report"]), st.just(0)),
)


@hypothesis_settings(
    max_examples=20,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(steps=st.lists(STEPS, max_size=12))
def test_any_order_of_completions_ticks_and_crashes_reports_each_generation_once(
    reporting: Reporting, steps: list[Step]
) -> None:
    """Whatever the order of completions, ticks and crashes: never two reports of a
    (day, generation), and after a clean tick every completion is reported and marked."""
    # Each example gets days of its own (the database and instance outlive an example).
    base = date(2026, 2, 1) + timedelta(days=3 * reporting.examples)
    reporting.examples += 1
    generations = [0, 0, 0]
    for action, index in steps:
        if action == "complete":
            generations[index] += 1
            reporting.complete(base + timedelta(days=index), generations[index])
            continue
        with pytest.MonkeyPatch.context() as patch:
            if action in CRASHES:
                patch.setattr(completions, CRASHES[action], _die)
            # (A tick with nothing to report does not reach the crash.)
            with contextlib.suppress(SystemExit):
                reporting.tick()
        _assert_never_twice(reporting, base)
    reporting.tick()
    _assert_never_twice(reporting, base)
    for index, last in enumerate(generations):
        day = base + timedelta(days=index)
        reported = sorted(int(e.tags["sluice/generation"]) for e in reporting.materializations(day))
        assert reported == list(range(1, last + 1))
    marks = reported_at(reporting.platform.engine, reporting.source)
    assert all(when is not None for (day, _), when in marks.items() if day >= base)


def _die(*args: Any) -> None:
    raise SystemExit("killed")


def _assert_never_twice(reporting: Reporting, base: date) -> None:
    for index in range(3):
        tags = [
            e.tags["sluice/generation"]
            for e in reporting.materializations(base + timedelta(days=index))
        ]
        assert len(tags) == len(set(tags)), tags


def status_of(reporting: Reporting) -> PlatformStatus:
    return platform_status(reporting.platform, reporting.source)


def status_text(status: PlatformStatus) -> str:
    console = Console(record=True, width=200)
    console.print(status_table(status))
    return console.export_text()
