"""The revenue example on the Iceberg clickstream table, on real services: a real run of the
Iceberg pipeline over the demo data (real Postgres holding Sluice's catalog, real local
Spark, real PyIceberg), then ``daily_revenue_by_country`` materialised through Dagster and
compared with an oracle computed from the landing files and the users table (plain Python,
no Spark, no Iceberg); its refresh by Dagster's declarative automation, evaluated with
``dagster.evaluate_automation_conditions`` against materialisations built by Sluice's own
completion report (``completion_materialization`` of the run's ``partition_completions``).

No ``__init__.py`` in this folder on purpose (see test_definitions.py).
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from dataclasses import dataclass
from datetime import date
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from conftest import TestSettings
from dagster import (
    AssetKey,
    AssetsDefinition,
    AssetSelection,
    DagsterInstance,
    Definitions,
    evaluate_automation_conditions,
    materialize,
)
from demo_platform import demo_discover, prepare_demo
from iceberg_tables import (
    differences,
    iceberg_pipeline,
    landing_revenue,
    load,
    oracle,
    table_name,
)
from sluice_resource import resource_for

from dagster_project import pipeline_definitions
from dagster_project.completions import completion_materialization
from enumerator_service import (
    ConfigError,
    connect_engine,
    database_url,
    unreported_completions,
)
from enumerator_service._operations import open_platform
from examples.clickstream import clickstream
from examples.clickstream_revenue import (
    REVENUE_TABLE,
    build_daily_revenue,
    daily_revenue_asset,
    read_days,
)
from spark_jobs import Pipeline
from spark_jobs.connectors.iceberg import sink_table_name
from spark_jobs.jobs import run_pipeline

pytestmark = pytest.mark.spark

DAY = date(2026, 1, 1)
OTHER_DAY = date(2026, 1, 2)
#: (revenue, orders, events) by user country.
Revenue = dict[str | None, tuple[float, int, int]]


@dataclass(frozen=True)
class Ran:
    settings: TestSettings
    pipeline: Pipeline
    revenue: AssetsDefinition


@pytest.fixture(scope="module")
def ran(db_url: str, tmp_path_factory: pytest.TempPathFactory) -> Ran:
    """One run of the test's Iceberg pipeline over the two demo days."""
    from test_assets import base_settings  # the module-scoped settings of the Dagster tests

    settings = base_settings(db_url, tmp_path_factory.mktemp("revenue"))
    platform = open_platform(settings)
    try:
        prepare_demo(settings, platform)
        demo_discover(platform)
        pipeline = iceberg_pipeline(settings)
        summary = run_pipeline(settings, pipeline)
        assert summary.rows_out > 0
    finally:
        platform.close()
    return Ran(settings, pipeline, daily_revenue_asset(settings, pipeline))


def written_revenue(settings: TestSettings, day: date) -> Revenue:
    folder = settings.warehouse_path / REVENUE_TABLE / f"dt={day.isoformat()}"
    files = sorted(Path(folder).glob("*.parquet"))
    assert len(files) == 1, files  # one file per day
    return {
        row["user_country"]: (row["revenue"], row["orders"], row["events"])
        for row in pq.read_table(files[0]).to_pylist()
    }


def materialize_day(ran: Ran, instance: DagsterInstance, day: date) -> dict[str, Any]:
    """Materialise the revenue of ``day``; its materialisation's metadata."""
    result = materialize(
        [ran.revenue],
        partition_key=day.isoformat(),
        resources={"sluice": resource_for(ran.settings)},
        instance=instance,
    )
    assert result.success
    (event,) = result.asset_materializations_for_node(REVENUE_TABLE)
    assert event.partition == day.isoformat()
    return {key: value.value for key, value in event.metadata.items()}


def test_revenue_of_a_day_equals_the_landing_oracle_and_names_its_snapshot(ran: Ran) -> None:
    settings = ran.settings
    platform = open_platform(settings)
    try:
        table = load(platform.engine, settings)
    finally:
        platform.close()
    snapshot = table.current_snapshot()
    assert snapshot is not None
    with DagsterInstance.ephemeral() as instance:
        instance.add_dynamic_partitions(f"{ran.pipeline.name}_days", [DAY.isoformat()])
        metadata = materialize_day(ran, instance, DAY)
    assert metadata["source_table"] == table_name(settings)
    assert metadata["source_snapshot_id"] == snapshot.snapshot_id

    expected = landing_revenue(settings, DAY)
    actual = written_revenue(settings, DAY)
    assert actual.keys() == expected.keys()
    for country, (revenue, orders, events) in expected.items():
        assert actual[country][0] == pytest.approx(revenue), country
        assert actual[country][1:] == (orders, events), country
    assert metadata["events"] == sum(events for _, _, events in expected.values())
    assert metadata["row_count"] == len(expected)
    assert metadata["preview"].startswith("| dt | user_country | revenue | orders | events |")
    # The snapshot the asset read holds the day exactly once: duplicates = missing = 0.
    (ids,) = read_days_ids(table, DAY, snapshot.snapshot_id)
    assert differences(ids, oracle(settings, {DAY})) == (0, 0, 0)

    # A re-run replaces the day's folder whole: one new file, the same rows, no staging left.
    folder = settings.warehouse_path / REVENUE_TABLE / f"dt={DAY.isoformat()}"
    (old,) = folder.glob("*.parquet")
    with DagsterInstance.ephemeral() as instance:
        instance.add_dynamic_partitions(f"{ran.pipeline.name}_days", [DAY.isoformat()])
        again = materialize_day(ran, instance, DAY)
    assert again["output_path"] == str(folder)
    assert again["source_snapshot_id"] == snapshot.snapshot_id  # no commit since
    assert written_revenue(settings, DAY) == actual
    assert not old.exists()
    assert not list((settings.warehouse_path / REVENUE_TABLE).glob("_*"))


def read_days_ids(table: Any, day: date, snapshot_id: int) -> list[Counter[str]]:
    """event_id counts of ``day`` as the asset's own scan reads them (by snapshot)."""
    rows = table.scan(
        row_filter=f"event_time >= '{day.isoformat()}T00:00:00+00:00'",
        selected_fields=("event_id", "event_time"),
        snapshot_id=snapshot_id,
    ).to_arrow()
    days = [t.date() for t in rows.column("event_time").to_pylist()]
    ids = rows.column("event_id").to_pylist()
    got = Counter(i for i, d in zip(ids, days, strict=True) if d == day)
    # The asset's scan (INPUT_COLUMNS only) reads as many rows of the day.
    assert read_days(table, [day], snapshot_id)[day].num_rows == sum(got.values())
    return [got]


def test_a_day_without_events_is_an_empty_revenue(ran: Ran) -> None:
    day = date(2026, 1, 5)
    with DagsterInstance.ephemeral() as instance:
        instance.add_dynamic_partitions(f"{ran.pipeline.name}_days", [day.isoformat()])
        metadata = materialize_day(ran, instance, day)
    assert metadata["row_count"] == 0
    assert written_revenue(ran.settings, day) == {}


def requested(result: Any, key: AssetKey) -> set[str]:
    return set(result.get_requested_partitions(key)) if result.get_num_requested(key) else set()


def test_a_completed_day_requests_its_revenue_and_a_rebuilt_day_again(ran: Ran) -> None:
    """Ticks of the revenue asset's automation condition: nothing before the upstream day is
    reported complete; its report (Sluice's completion materialisation) requests that day
    only, once; a new materialisation of the day (a rebuild) requests it again."""
    settings, pipeline = ran.settings, ran.pipeline
    output = pipeline_definitions(pipeline, settings).output
    defs = Definitions(assets=[output, ran.revenue], resources={"sluice": resource_for(settings)})
    # The code location's sensor targets the assets that have a condition: this one.
    only = AssetSelection.assets(ran.revenue.key)

    def tick(cursor: Any = None) -> Any:
        return evaluate_automation_conditions(
            defs=defs, instance=instance, asset_selection=only, cursor=cursor
        )

    engine = connect_engine(database_url(settings, create=False), pool_size=1)
    try:
        completions = unreported_completions(engine, pipeline.name, 100)
    finally:
        engine.dispose()
    first = next(c for c in completions if c.partition_key == DAY)
    with DagsterInstance.ephemeral() as instance:
        instance.add_dynamic_partitions(
            f"{pipeline.name}_days", [DAY.isoformat(), OTHER_DAY.isoformat()]
        )
        # Both days known to Dagster, neither reported complete: nothing requested.
        result = tick()
        assert result.total_requested == 0
        result = tick(result.cursor)
        assert result.total_requested == 0

        instance.report_runless_asset_event(completion_materialization(output.key, first, True))
        result = tick(result.cursor)
        assert requested(result, ran.revenue.key) == {DAY.isoformat()}
        assert result.total_requested == 1
        # Requested once: the next tick asks for nothing more.
        result = tick(result.cursor)
        assert result.total_requested == 0

        # The day rebuilt: its next generation is reported, the revenue is requested again.
        rebuilt = dataclasses.replace(first, generation=first.generation + 1)
        instance.report_runless_asset_event(completion_materialization(output.key, rebuilt, True))
        result = tick(result.cursor)
        assert requested(result, ran.revenue.key) == {DAY.isoformat()}
        assert result.total_requested == 1


def test_an_upstream_table_not_written_yet_is_one_line_not_an_empty_revenue(
    make_settings: Any,
) -> None:
    settings: TestSettings = make_settings()
    with pytest.raises(ConfigError) as failed:
        build_daily_revenue(settings, [DAY], iceberg_pipeline(settings))
    message = str(failed.value)
    assert message == (
        f"pipeline {settings.source_name}: IcebergSink(table): {table_name(settings)} does not "
        "exist yet (no run of the pipeline has committed to it)"
    )
    assert not (settings.warehouse_path / REVENUE_TABLE).exists()  # nothing written
    with pytest.raises(ConfigError, match=r"^pipeline clickstream: sink: is parquet, not an"):
        sink_table_name(clickstream)
