"""Both discovery sensors over a backlog larger than the per-tick cap, invoked directly with
real Dagster sensor contexts and the real embedded Postgres: two ticks drain it, each tick
registers at most the cap, and the tick results and cursors say what is left.

No ``__init__.py`` in this folder on purpose (see test_definitions.py).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any

import sqlalchemy as sa
from conftest import TestSettings
from dagster import (
    DagsterInstance,
    DagsterRun,
    DagsterRunStatus,
    RunRequest,
    SkipReason,
)
from dagster_support import demo_definitions, sensor_named, sensor_tick
from sluice_resource import resource_for

from dagster_project import PipelineDefinitions
from dagster_project._runs import PIPELINE_TAG
from dagster_project.continuous import GENERATION_TAG, MODE_TAG, SLUICE_RUN_TAG
from dagster_project.resources import SluiceResource
from dagster_project.sensors import BACKLOG_TAG, FilesSensorCursor
from enumerator_service import Settings, StaticFileEnumerator, connect_engine
from enumerator_service._schema import splits

MakeSettings = Callable[..., TestSettings]
CAP = 3
FILES = 5  # a backlog larger than the cap, drained by two ticks
T0 = 1_767_225_600.0


def capped_resource(settings: Settings, cap: int = CAP) -> SluiceResource:
    return resource_for(settings, discovery_max_files_per_tick=cap)


def land_backlog(settings: TestSettings, files: int = FILES) -> list[str]:
    """``files`` landing files; the first three share one mtime (a chunk boundary inside it)."""
    folder = settings.landing_path / "dt=2026-01-01"
    folder.mkdir(parents=True)
    paths = []
    for i in range(files):
        path = folder / f"part-{i:05d}.jsonl"
        path.write_text(
            f'{{"event_id": "e-{i}", "user_id": 1, "event_time": "2026-01-01T00:00:00+00:00", '
            '"event_type": "click", "amount": 0.0}\n'
        )
        mtime = T0 if i < 3 else T0 + i
        os.utime(path, (mtime, mtime))
        paths.append(str(path.absolute()))
    return paths


def split_rows(settings: TestSettings) -> list[tuple[str, str, str | None]]:
    """(uri, status, run id) of the source's splits, in registration order."""
    assert settings.database_url is not None
    engine = connect_engine(settings.database_url.get_secret_value())
    stmt = (
        sa.select(splits.c.uri, splits.c.status, splits.c.run_id)
        .where(splits.c.source == settings.source_name)
        .order_by(splits.c.id)
    )
    try:
        with engine.connect() as conn:
            return [(uri, status, run) for uri, status, run in conn.execute(stmt)]
    finally:
        engine.dispose()


def files_tick(
    built: PipelineDefinitions, sluice: SluiceResource, cursor: str | None
) -> tuple[Any, str | None]:
    return sensor_tick(sensor_named(built, "new_files"), sluice, cursor)


def continuous_tick(
    built: PipelineDefinitions,
    instance: DagsterInstance,
    sluice: SluiceResource,
    cursor: str | None,
) -> tuple[Any, str | None]:
    return sensor_tick(sensor_named(built, "continuous"), sluice, cursor, instance)


def test_new_files_sensor_drains_a_backlog_in_two_ticks(make_settings: MakeSettings) -> None:
    settings = make_settings()
    paths = land_backlog(settings)
    sluice = capped_resource(settings)
    built = demo_definitions(settings)

    first, cursor = files_tick(built, sluice, None)
    assert isinstance(first, RunRequest)
    assert first.tags["sluice/splits_registered"] == str(CAP)
    assert first.tags[BACKLOG_TAG] == str(FILES - CAP)
    assert FilesSensorCursor.parse(cursor) == FilesSensorCursor(1, FILES - CAP)
    assert [uri for uri, _, _ in split_rows(settings)] == paths[:CAP]

    second, cursor = files_tick(built, sluice, cursor)
    assert isinstance(second, RunRequest)  # the rest of the backlog: its own run
    assert second.run_key != first.run_key
    assert second.tags["sluice/splits_registered"] == str(FILES - CAP)
    assert second.tags[BACKLOG_TAG] == "0"
    assert FilesSensorCursor.parse(cursor) == FilesSensorCursor(2, 0)
    assert [uri for uri, _, _ in split_rows(settings)] == paths  # each once, in order

    third, cursor = files_tick(built, sluice, cursor)
    assert isinstance(third, SkipReason)
    assert (third.skip_message or "").startswith("no new input")
    assert "backlog" not in (third.skip_message or "")
    assert FilesSensorCursor.parse(cursor) == FilesSensorCursor(2, 0)


def test_new_files_sensor_reports_a_backlog_on_a_skipped_tick(
    make_settings: MakeSettings,
) -> None:
    """Files a backfill registered already (bounded listing, no cursor) are still new to the
    continuous cursor: a chunk of them adds no split, so the tick skips, yet it says that a
    backlog remains, and the next tick goes on with it."""
    settings = make_settings()
    paths = land_backlog(settings)
    sluice = capped_resource(settings)
    built = demo_definitions(settings)
    assert settings.database_url is not None
    engine = connect_engine(settings.database_url.get_secret_value())
    try:
        StaticFileEnumerator(engine, settings.source_name, settings.landing_path).discover()
    finally:
        engine.dispose()

    first, cursor = files_tick(built, sluice, None)
    assert isinstance(first, SkipReason)
    assert "2 files left for the next ticks (backlog)" in (first.skip_message or "")
    assert json.loads(cursor or "") == {"sequence": 0, "backlog_files": FILES - CAP}
    second, cursor = files_tick(built, sluice, cursor)
    assert isinstance(second, SkipReason)
    assert (second.skip_message or "").startswith("no new input")
    assert FilesSensorCursor.parse(cursor) == FilesSensorCursor(0, 0)
    assert sorted(uri for uri, _, _ in split_rows(settings)) == paths


def test_continuous_sensor_drains_a_backlog_into_its_one_live_run(
    make_settings: MakeSettings,
) -> None:
    settings = make_settings()
    paths = land_backlog(settings)
    sluice = capped_resource(settings)
    built = demo_definitions(settings)
    with DagsterInstance.ephemeral() as instance:
        first, cursor = continuous_tick(built, instance, sluice, None)
        assert isinstance(first, RunRequest)
        assert first.tags[GENERATION_TAG] == "1"
        assert first.tags["sluice/splits_assigned"] == str(CAP)
        assert first.tags[BACKLOG_TAG] == str(FILES - CAP)
        assert json.loads(cursor or "")["backlog_files"] == FILES - CAP
        run_id = first.tags[SLUICE_RUN_TAG]
        assert split_rows(settings) == [(p, "ASSIGNED", run_id) for p in paths[:CAP]]

        # The requested run is live: the second tick registers the rest and feeds it to that
        # run; no second run is requested.
        tags = {k: first.tags[k] for k in (MODE_TAG, PIPELINE_TAG, GENERATION_TAG, SLUICE_RUN_TAG)}
        instance.add_run(
            DagsterRun(
                job_name=built.continuous_job.name, status=DagsterRunStatus.STARTED, tags=tags
            )
        )
        second, cursor = continuous_tick(built, instance, sluice, cursor)
        assert isinstance(second, SkipReason)
        assert f"{FILES - CAP} assigned to the live continuous run" in (second.skip_message or "")
        assert "backlog" not in (second.skip_message or "")
        state = json.loads(cursor or "")
        assert state == {"generation": 1, "run_id": run_id, "backlog_files": 0}
        assert split_rows(settings) == [(p, "ASSIGNED", run_id) for p in paths]


def test_continuous_sensor_waiting_for_its_run_keeps_draining(
    make_settings: MakeSettings,
) -> None:
    """Between the request and the run's start, ticks go on registering the backlog (kept
    unassigned for the run) and never request a second run."""
    settings = make_settings()
    paths = land_backlog(settings, files=7)
    sluice = capped_resource(settings)
    built = demo_definitions(settings)
    with DagsterInstance.ephemeral() as instance:
        first, cursor = continuous_tick(built, instance, sluice, None)
        assert isinstance(first, RunRequest)
        assert json.loads(cursor or "")["backlog_files"] == 4
        second, cursor = continuous_tick(built, instance, sluice, cursor)
        assert isinstance(second, SkipReason)
        message = second.skip_message or ""
        assert message.startswith("waiting for continuous run generation 1")
        assert message.endswith("; 1 files left for the next ticks (backlog)")
        assert json.loads(cursor or "")["generation"] == 1
        assert json.loads(cursor or "")["backlog_files"] == 1
        third, cursor = continuous_tick(built, instance, sluice, cursor)
        assert isinstance(third, SkipReason)
        assert json.loads(cursor or "")["backlog_files"] == 0
        rows = split_rows(settings)
        assert [uri for uri, _, _ in rows] == paths
        assert [status for _, status, _ in rows] == ["ASSIGNED"] * 3 + ["UNASSIGNED"] * 4


def test_the_cap_is_a_resource_setting() -> None:
    settings = SluiceResource(discovery_max_files_per_tick=42).settings()
    assert settings.discovery_max_files_per_tick == 42
