"""The Delta sink under Dagster: a backfill of two days materialises the output asset with
the table's URI, its version and what the run's commits added (from the commit info the
sink writes beside its app transactions), and its checks pass against the Delta table."""

from __future__ import annotations

import dataclasses
from collections import Counter
from datetime import date
from pathlib import Path
from typing import Any

import pytest
from conftest import TestSettings as Settings
from deltalake import DeltaTable
from demo_platform import demo_discover, demo_pipeline, prepare_demo
from landing_oracle import expected_events

from enumerator_service._operations import open_platform
from spark_jobs import DeltaSink

pytestmark = pytest.mark.spark

DAY, OTHER_DAY = date(2026, 1, 1), date(2026, 1, 2)


def test_a_dagster_backfill_into_delta_carries_the_table_in_its_metadata(
    make_settings: Any, tmp_path: Path
) -> None:
    from dagster import DagsterInstance, materialize
    from sluice_resource import resource_for

    from dagster_project import pipeline_definitions

    settings: Settings = make_settings(demo_events=300, demo_days=2, demo_files_per_day=2)
    platform = open_platform(settings)
    try:
        prepare_demo(settings, platform)
        demo_discover(platform)
    finally:
        platform.close()
    table = tmp_path / "lake" / "events"
    pipeline = dataclasses.replace(demo_pipeline(settings), sink=DeltaSink(str(table)))
    source = dataclasses.replace(pipeline.source, start_date=settings.demo_start_date)
    built = pipeline_definitions(dataclasses.replace(pipeline, source=source), settings)
    with DagsterInstance.ephemeral() as instance:
        result = materialize(
            [built.output, *built.checks],
            tags={
                "dagster/asset_partition_range_start": DAY.isoformat(),
                "dagster/asset_partition_range_end": OTHER_DAY.isoformat(),
            },
            resources={"sluice": resource_for(settings)},
            instance=instance,
        )
    assert result.success
    checks = result.get_asset_check_evaluations()
    assert checks and all(check.passed for check in checks)
    (materialized, *_) = result.asset_materializations_for_node(pipeline.name)
    metadata = {key: value.value for key, value in materialized.metadata.items()}
    events, _bad = expected_events(Path(settings.landing_path))
    delta = DeltaTable(str(table))
    ids = Counter(
        str(r["event_id"]) for r in delta.to_pyarrow_table(columns=["event_id"]).to_pylist()
    )
    assert ids == Counter(str(e["event_id"]) for e in events)  # exactly once
    assert metadata["dagster/uri"] == str(table)
    assert metadata["delta_version"] == delta.version()
    assert metadata["rows_added"] == metadata["rows_out"] == len(events)
    assert metadata["files_added"] == len(delta.file_uris()) > 0
    assert metadata["commits_added"] >= 1
