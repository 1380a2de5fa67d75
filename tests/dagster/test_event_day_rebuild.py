"""Dagster materialisations of event-day partitions over cross-day files (real Postgres, real
local Spark): materialising day by day, then re-materialising a day, leaves every day with
its rows from all files; the re-materialised day gets a new completion generation with the
rebuild's counts, and the other day's folder is untouched byte for byte."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

import orjson
import pyarrow.dataset as ds
import pytest
import sqlalchemy as sa
from conftest import TestSettings
from dagster import DagsterInstance, ExecuteInProcessResult, materialize
from dagster_support import demo_definitions
from demo_platform import prepare_demo
from landing_oracle import expected_events
from sluice_resource import resource_for

from dagster_project import PipelineDefinitions
from enumerator_service._operations import open_platform
from enumerator_service._schema import partition_completions, partition_stats

pytestmark = pytest.mark.spark

MakeSettings = Callable[..., TestSettings]


def _file(settings: TestSettings, folder: date, name: str, times: list[datetime]) -> None:
    lines = [
        orjson.dumps(
            {
                "event_id": f"{name}-{i}",
                "user_id": 1,
                "event_time": when.isoformat(),
                "event_type": "click",
                "amount": 1.0,
            }
        )
        for i, when in enumerate(times)
    ]
    path = Path(settings.landing_path) / f"dt={folder.isoformat()}" / f"{name}.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")


def _ids(settings: TestSettings, day: date) -> list[str]:
    folder = Path(settings.output_path) / f"dt={day.isoformat()}"
    return sorted(ds.dataset(folder, format="parquet").to_table().column("event_id").to_pylist())


def _bytes(settings: TestSettings, day: date) -> dict[str, str]:
    folder = Path(settings.output_path) / f"dt={day.isoformat()}"
    return {
        p.name: hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def _materialize(
    built: PipelineDefinitions, settings: TestSettings, instance: DagsterInstance, day: date
) -> ExecuteInProcessResult:
    return materialize(
        [built.output],
        partition_key=day.isoformat(),
        resources={"sluice": resource_for(settings)},
        instance=instance,
    )


def _metadata(result: ExecuteInProcessResult, name: str) -> dict[str, Any]:
    (event,) = result.asset_materializations_for_node(name)
    return {key: value.value for key, value in event.metadata.items()}


def test_materialising_days_of_cross_day_files_and_re_materialising_one(
    make_settings: MakeSettings,
) -> None:
    settings = make_settings(demo_events=200, demo_users=100, demo_files_per_day=1)
    platform = open_platform(settings)
    try:
        prepare_demo(settings, platform)
        d1 = settings.demo_start_date
        d2 = d1 + timedelta(days=1)
        at = datetime(d1.year, d1.month, d1.day, tzinfo=UTC)
        _file(settings, d2, "cross-a", [at + timedelta(hours=h) for h in (20, 21)])  # d1 events
        _file(settings, d1, "cross-b", [at + timedelta(days=1, hours=h) for h in (1, 2)])  # d2
        expected, _ = expected_events(Path(settings.landing_path))
        oracle = {
            day: sorted(e["event_id"] for e in expected if e["event_time"].date() == day)
            for day in (d1, d2)
        }
        built = demo_definitions(settings)
        name = built.output.key.to_user_string()
        with DagsterInstance.ephemeral() as instance:
            # Day by day, as a backfill with one run per partition: d2's own files are read
            # for the first time by d2's run (a rebuild of d2, which cross-b already fed).
            assert _materialize(built, settings, instance, d1).success
            second = _materialize(built, settings, instance, d2)
            assert second.success
            assert _metadata(second, name)["rebuilt_partitions"] == d2.isoformat()
            assert _ids(settings, d1) == oracle[d1]  # cross-a's d1 rows, written by d2's run
            assert _ids(settings, d2) == oracle[d2]
            bytes_d2 = _bytes(settings, d2)

            third = _materialize(built, settings, instance, d1)  # re-materialised
            assert third.success
            assert _metadata(third, name)["rebuilt_partitions"] == d1.isoformat()
            assert _ids(settings, d1) == oracle[d1]
            assert _bytes(settings, d2) == bytes_d2
        with platform.engine.connect() as conn:
            source = built.pipeline.name
            stats = {
                row.partition_key: row
                for row in conn.execute(
                    sa.select(partition_stats).where(partition_stats.c.source == source)
                )
            }
            completions = conn.execute(
                sa.select(partition_completions)
                .where(partition_completions.c.source == source)
                .order_by(partition_completions.c.partition_key, partition_completions.c.generation)
            ).all()
        assert {day: row.rows for day, row in stats.items()} == {
            d1: len(oracle[d1]),
            d2: len(oracle[d2]),
        }
        assert stats[d1].late_records == 0 and stats[d1].open is False
        last_d1 = [c for c in completions if c.partition_key == d1][-1]
        assert last_d1.generation == stats[d1].generation >= 2
        assert (last_d1.rows, last_d1.late_records) == (len(oracle[d1]), 0)
        last_d2 = [c for c in completions if c.partition_key == d2][-1]
        assert last_d2.rows == len(oracle[d2])
    finally:
        platform.close()
