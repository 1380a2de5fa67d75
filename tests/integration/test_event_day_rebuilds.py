"""Rebuilds by event day (real Postgres, real local Spark, real files): re-materialising day
D re-reads every file that fed D — files of other landing days included — replaces D's
folder with D's rows from all files, sets D's stats to the rebuild's counts and records a
new completion generation, and leaves the other days' output, stats and dead letters as
they were; a rebuild that cannot be exact is refused before anything changes."""

from __future__ import annotations

import dataclasses
import hashlib
import os
import signal
import threading
import time
from collections.abc import Iterator
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

import orjson
import pyarrow.dataset as ds
import pytest
import sqlalchemy as sa
from conftest import TestSettings as Settings
from demo_platform import demo_discover, demo_pipeline, prepare_demo
from landing_oracle import expected_events
from spark_workers import python_workers

from enumerator_service._operations import Platform, open_platform
from enumerator_service._rebuilds import CrossDayRebuildError, RebuildStore
from enumerator_service._schema import (
    dead_letters,
    partition_completions,
    partition_rebuilds,
    partition_stats,
    split_partitions,
    splits,
)
from spark_jobs import Pipeline
from spark_jobs.jobs import RunSummary, run_pipeline

pytestmark = pytest.mark.spark

MISSING_USER = 999_999
RUN_LIMIT = 180.0


@pytest.fixture
def cross_day(make_settings: Any) -> Iterator[tuple[Settings, Platform, Pipeline]]:
    """Two demo days d1, d2 plus cross-day files: one landing on d2 with d1 events (one of an
    unknown user: a lookup miss of d1), one landing on d1 with d2 events (one of an unknown
    user: a miss of d2) — all processed once."""
    settings: Settings = make_settings(demo_events=240, demo_days=2, demo_files_per_day=2)
    platform = open_platform(settings)
    prepare_demo(settings, platform)
    d1 = settings.demo_start_date
    d2 = d1 + timedelta(days=1)
    at = datetime(d1.year, d1.month, d1.day, tzinfo=UTC)
    _file(settings, d2, "cross-a", [at + timedelta(hours=h) for h in (20, 21, 22)], miss=2)
    _file(settings, d1, "cross-b", [at + timedelta(days=1, hours=h) for h in (1, 2)], miss=0)
    pipeline = demo_pipeline(settings)
    lookup = dataclasses.replace(pipeline.steps[0], on_miss="dead_letter")
    pipeline = dataclasses.replace(pipeline, steps=[lookup, *pipeline.steps[1:]])
    demo_discover(platform)
    run_pipeline(settings, pipeline)
    yield settings, platform, pipeline
    platform.close()


def _file(settings: Settings, folder: date, name: str, times: list[datetime], miss: int) -> None:
    """A landing file of ``dt=<folder>``; record ``miss`` has an unknown user."""
    lines = [
        orjson.dumps(
            {
                "event_id": f"{name}-{i}",
                "user_id": MISSING_USER if i == miss else 1,
                "event_time": when.isoformat(),
                "event_type": "click",
                "amount": 1.0,
            }
        )
        for i, when in enumerate(times)
    ]
    path = Path(settings.landing_path) / f"dt={folder.isoformat()}" / f"{name}.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n{not json\n")


def _folder_bytes(settings: Settings, day: date) -> dict[str, str]:
    folder = Path(settings.output_path) / f"dt={day.isoformat()}"
    return {
        p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def _day_rows(settings: Settings, day: date) -> list[dict[str, Any]]:
    folder = Path(settings.output_path) / f"dt={day.isoformat()}"
    return ds.dataset(folder, format="parquet").to_table().to_pylist()


def _state(platform: Platform, day: date) -> dict[str, Any]:
    source = platform.settings.source_name
    with platform.engine.connect() as conn:
        stats = conn.execute(
            sa.select(partition_stats).where(
                partition_stats.c.source == source, partition_stats.c.partition_key == day
            )
        ).one()
        completions = conn.execute(
            sa.select(partition_completions)
            .where(
                partition_completions.c.source == source,
                partition_completions.c.partition_key == day,
            )
            .order_by(partition_completions.c.generation)
        ).all()
        letters = conn.execute(
            sa.select(
                dead_letters.c.id,
                dead_letters.c.split_id,
                dead_letters.c.offset,
                dead_letters.c.reason,
                dead_letters.c.raw,
            )
            .where(dead_letters.c.source == source, dead_letters.c.partition_key == day)
            .order_by(dead_letters.c.split_id, dead_letters.c.offset)
        ).all()
    return {
        "stats": stats._mapping,
        "completions": completions,
        "letters": [tuple(row) for row in letters],
    }


def _add_missing_user(platform: Platform) -> None:
    """The dimension row the misses lacked: a rebuild now resolves them."""
    users = sa.Table("users", sa.MetaData(), schema="public", autoload_with=platform.engine)
    with platform.engine.begin() as conn:
        row = dict(conn.execute(sa.select(users).limit(1)).one()._mapping)
        conn.execute(sa.insert(users).values({**row, "id": MISSING_USER}))


def test_rebuilding_a_day_re_reads_every_file_that_fed_it_and_leaves_other_days_alone(
    cross_day: tuple[Settings, Platform, Pipeline],
) -> None:
    settings, platform, pipeline = cross_day
    d1 = settings.demo_start_date
    d2 = d1 + timedelta(days=1)
    source = settings.source_name
    before_d1, before_d2 = _state(platform, d1), _state(platform, d2)
    bytes_d2 = _folder_bytes(settings, d2)
    assert before_d1["stats"]["foreign_rows"] == 2  # cross-a's d1 rows (its miss is a dead letter)
    # (1 or 2 generations: cross-a's d1 rows reopen d1 if it completed before they came)
    first = [(c.generation, c.rows, c.dead_letters) for c in before_d1["completions"]]
    assert [g for g, _, _ in first] in ([1], [1, 2])
    with platform.engine.connect() as conn:
        fed_d1 = set(
            conn.execute(
                sa.select(splits.c.uri)
                .join(split_partitions, split_partitions.c.split_id == splits.c.id)
                .where(splits.c.source == source, split_partitions.c.partition_key == d1)
            ).scalars()
        )
        all_letters = conn.execute(
            sa.select(sa.func.count()).where(dead_letters.c.source == source)
        ).scalar_one()
    # cross-a (landing d2) fed d1 with rows; cross-b (landing d1, d2 events) with its
    # reader dead letter only: both are members of d1's rebuild.
    assert {uri.rsplit("/", 1)[1] for uri in fed_d1} >= {"cross-a.jsonl", "cross-b.jsonl"}

    _add_missing_user(platform)
    summary = run_pipeline(settings, pipeline, dates=[d1], rebuild=True)
    assert summary.rebuilt == (d1.isoformat(),)

    # d1 = the oracle: every well-formed d1 event of every file, the miss now resolved.
    expected, _ = expected_events(Path(settings.landing_path))
    oracle = sorted(e["event_id"] for e in expected if e["event_time"].date() == d1)
    rows = _day_rows(settings, d1)
    assert sorted(r["event_id"] for r in rows) == oracle
    assert "cross-a-2" in oracle
    after_d1 = _state(platform, d1)
    stats = after_d1["stats"]
    # d1's dead letters now: the reader's of its landing files only (the miss resolved).
    readers = [letter for letter in after_d1["letters"] if not letter[3].startswith("lookup")]
    assert len(after_d1["letters"]) == len(readers) == len(before_d1["letters"]) - 1
    assert (stats["rows"], stats["dead_letters"], stats["late_records"]) == (
        len(oracle),
        len(readers),
        0,
    )
    assert stats["foreign_rows"] == 3 and stats["open"] is False
    generations = [(c.generation, c.rows, c.dead_letters) for c in after_d1["completions"]]
    assert first[-1][1:] == (before_d1["stats"]["rows"], before_d1["stats"]["dead_letters"])
    assert generations == [*first, (len(first) + 1, len(oracle), len(readers))]
    assert after_d1["completions"][-1].reported_at is None  # the reporter's to tell Dagster

    # d2: byte for byte, stats, completions and dead letters (its miss stays: not rebuilt).
    assert _folder_bytes(settings, d2) == bytes_d2
    assert _state(platform, d2) == before_d2
    assert any(b"cross-b-0" in letter[4] for letter in before_d2["letters"])
    with platform.engine.connect() as conn:
        assert (
            conn.execute(
                sa.select(sa.func.count()).where(dead_letters.c.source == source)
            ).scalar_one()
            == all_letters - 1  # only d1's resolved miss went; none written twice
        )
        leftover = conn.execute(
            sa.select(sa.func.count()).where(
                splits.c.source == source,
                sa.or_(splits.c.rebuild_id.is_not(None), splits.c.status != "COMPLETED"),
            )
        ).scalar_one()
    assert leftover == 0


def test_files_no_run_read_wait_for_the_swap_and_join_the_new_generation(
    cross_day: tuple[Settings, Platform, Pipeline],
) -> None:
    """A file registered but never read when the rebuild starts may hold rows of the day: it
    is HELD until the swap (not written into the folder being replaced), then the next run
    adds its rows to the new generation, counted on top of the rebuild's."""
    settings, platform, pipeline = cross_day
    d1 = settings.demo_start_date
    d3 = d1 + timedelta(days=2)
    at = datetime(d1.year, d1.month, d1.day, 3, tzinfo=UTC)
    (Path(settings.landing_path) / f"dt={d3.isoformat()}").mkdir()
    _file(settings, d3, "unread", [at, at + timedelta(days=2)], miss=-1)
    demo_discover(platform)
    summary = run_pipeline(settings, pipeline, dates=[d1], rebuild=True)
    assert summary.rebuilt == (d1.isoformat(),)
    with platform.engine.connect() as conn:
        status = conn.execute(
            sa.select(splits.c.status).where(
                splits.c.source == settings.source_name, splits.c.uri.like("%unread.jsonl")
            )
        ).scalar_one()
    assert status == "UNASSIGNED"  # released by the swap, not read by the rebuild
    rows_d1 = len(_day_rows(settings, d1))
    assert "unread-0" not in {r["event_id"] for r in _day_rows(settings, d1)}
    run_pipeline(settings, pipeline)
    assert "unread-0" in {r["event_id"] for r in _day_rows(settings, d1)}
    stats = _state(platform, d1)["stats"]
    assert stats["rows"] == rows_d1 + 1 == len(_day_rows(settings, d1))


def test_a_rebuild_refuses_while_a_file_that_fed_the_day_is_half_read(
    cross_day: tuple[Settings, Platform, Pipeline],
) -> None:
    """A member re-read for the day writes only the day's rows, so a file that fed the day
    must have been read to the end: otherwise its other days' rows would never be written.
    Refused in one line, nothing changed."""
    settings, platform, _pipeline = cross_day
    d1 = settings.demo_start_date
    with platform.engine.begin() as conn:  # as a dead run leaves a split given back
        conn.execute(
            sa.update(splits)
            .where(splits.c.source == settings.source_name, splits.c.uri.like("%cross-a.jsonl"))
            .values(status="UNASSIGNED", committed_offset=10)
        )
    with pytest.raises(CrossDayRebuildError) as raised:
        RebuildStore(platform.engine).start(
            settings.source_name, [d1], "rebuilder", lease_seconds=60, event_days=True
        )
    message = str(raised.value)
    assert "\n" not in message
    assert f"partition {d1} of" in message and "cross-a.jsonl" in message
    assert "not read to the end" in message
    with platform.engine.connect() as conn:
        source = settings.source_name
        assert not conn.execute(
            sa.select(partition_rebuilds.c.id).where(partition_rebuilds.c.source == source)
        ).first()
        assert not conn.execute(
            sa.select(splits.c.id).where(
                splits.c.source == source,
                sa.or_(splits.c.rebuild_id.is_not(None), splits.c.status == "HELD"),
            )
        ).first()


# -- crashes ------------------------------------------------------------------------------


def _tally(platform: Platform, source: str) -> int:
    with platform.engine.connect() as conn:
        return int(
            conn.execute(
                sa.select(sa.func.coalesce(sa.func.sum(partition_rebuilds.c.rows), 0)).where(
                    partition_rebuilds.c.source == source,
                    partition_rebuilds.c.status == "BUILDING",
                )
            ).scalar_one()
        )


def test_a_sigkilled_worker_mid_rebuild_restores_and_counts_each_row_once(
    make_settings: Any,
) -> None:
    """A Python worker SIGKILLed once a rebuild member's checkpoint committed part of the
    tally: the stage restarts from the committed checkpoint, and the day ends with exactly
    its rows, its counts and one new completion generation (nothing counted twice)."""
    settings: Settings = make_settings(
        demo_events=3_000,
        demo_users=2_000,
        demo_days=2,
        demo_files_per_day=2,
        target_split_bytes=64 << 10,
        read_block_bytes=16 << 10,
        lookup_capacity=1,
        lookup_injected_latency_ms=100,
        checkpoint_interval_seconds=0.1,
        checkpoint_timeout_seconds=10,
        lease_seconds=5,
    )
    platform = open_platform(settings)
    out: list[Any] = []
    thread = threading.Thread()
    try:
        prepare_demo(settings, platform)
        d1 = settings.demo_start_date
        d2 = d1 + timedelta(days=1)
        at = datetime(d1.year, d1.month, d1.day, tzinfo=UTC)
        _file(settings, d2, "cross-a", [at + timedelta(hours=h) for h in (20, 21, 22)], miss=-1)
        pipeline = demo_pipeline(settings)
        demo_discover(platform)
        run_pipeline(settings, pipeline)
        before = _state(platform, d1)
        bytes_d2 = _folder_bytes(settings, d2)

        def rebuild() -> None:
            try:
                out.append(run_pipeline(settings, pipeline, dates=[d1], rebuild=True))
            except BaseException as exc:
                out.append(exc)

        thread = threading.Thread(target=rebuild, daemon=True)
        thread.start()
        killed = None
        deadline = time.monotonic() + RUN_LIMIT
        while killed is None and thread.is_alive() and time.monotonic() < deadline:
            workers = python_workers()
            if _tally(platform, settings.source_name) > 0 and workers:
                killed = workers[0].pid
                os.kill(killed, signal.SIGKILL)
            time.sleep(0.05)
        thread.join(RUN_LIMIT)
        assert not thread.is_alive(), "the rebuild hangs"
        assert killed is not None, "the rebuild ended before a kill"
        (summary,) = out
        assert isinstance(summary, RunSummary), summary
        assert summary.rebuilt == (d1.isoformat(),)
        expected, _ = expected_events(Path(settings.landing_path))
        oracle = sorted(e["event_id"] for e in expected if e["event_time"].date() == d1)
        assert sorted(r["event_id"] for r in _day_rows(settings, d1)) == oracle
        after = _state(platform, d1)
        assert after["stats"]["rows"] == len(oracle) == before["stats"]["rows"]
        assert after["stats"]["dead_letters"] == before["stats"]["dead_letters"]
        assert len(after["letters"]) == len(before["letters"])  # none written twice
        # (cross-a's d1 rows may have reopened d1 in the first run: late under "reopen")
        generations = [c.generation for c in before["completions"]]
        assert [c.generation for c in after["completions"]] == [*generations, generations[-1] + 1]
        newest = after["completions"][-1]
        assert (newest.rows, newest.late_records) == (len(oracle), 0)
        assert _folder_bytes(settings, d2) == bytes_d2
    finally:
        thread.join(RUN_LIMIT)
        platform.close()


def test_a_rebuild_whose_run_died_keeps_the_old_day_live_until_the_next_run_swaps_it(
    cross_day: tuple[Settings, Platform, Pipeline], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The rebuild run re-reads every member, then dies before the swap: readers still see
    the old d1 and its old counts; the next (incremental) run swaps the rebuild in once."""
    settings, platform, pipeline = cross_day
    d1 = settings.demo_start_date
    d2 = d1 + timedelta(days=1)
    before = _state(platform, d1)
    bytes_d1, bytes_d2 = _folder_bytes(settings, d1), _folder_bytes(settings, d2)
    _add_missing_user(platform)  # the rebuild's d1 differs: the old generation is visible
    monkeypatch.setattr(
        "spark_jobs.connectors.parquet.ParquetConnector.finish_rebuilds", lambda *a, **k: []
    )
    with pytest.raises(RuntimeError, match="not complete"):
        run_pipeline(settings, pipeline, dates=[d1], rebuild=True)
    monkeypatch.undo()
    assert _folder_bytes(settings, d1) == bytes_d1
    assert _state(platform, d1) == before  # stats, completions, dead letters: old ones

    run_pipeline(settings, pipeline)  # the next run, not a --replace
    with platform.engine.connect() as conn:
        statuses = conn.execute(
            sa.select(partition_rebuilds.c.status).where(
                partition_rebuilds.c.source == settings.source_name
            )
        ).scalars()
        assert list(statuses) == ["DONE"]
    after = _state(platform, d1)
    # (the fixture's run leaves 1 or 2 generations: see the first test of this module)
    generations = [c.generation for c in before["completions"]]
    swapped = [*generations, generations[-1] + 1]
    assert [c.generation for c in after["completions"]] == swapped
    assert after["stats"]["rows"] == before["stats"]["rows"] + 1  # the resolved miss
    assert len(after["letters"]) == len(before["letters"]) - 1
    assert _folder_bytes(settings, d2) == bytes_d2
    run_pipeline(settings, pipeline)  # nothing left: no further generation
    assert [c.generation for c in _state(platform, d1)["completions"]] == swapped


def test_a_rebuild_started_by_a_run_that_died_at_once_is_finished_by_the_next_run(
    cross_day: tuple[Settings, Platform, Pipeline],
) -> None:
    """The members (cross-a, landing on d2, among them) are assigned to a run that dies at
    once (its leases expire): the next incremental run reads them for d1 and swaps d1."""
    settings, platform, pipeline = cross_day
    d1 = settings.demo_start_date
    d2 = d1 + timedelta(days=1)
    before = _state(platform, d1)
    bytes_d1, bytes_d2 = _folder_bytes(settings, d1), _folder_bytes(settings, d2)
    RebuildStore(platform.engine).start(
        settings.source_name, [d1], "dead-run", lease_seconds=0, event_days=True
    )
    assert _folder_bytes(settings, d1) == bytes_d1  # the old generation stays live
    run_pipeline(settings, pipeline)
    expected, _ = expected_events(Path(settings.landing_path))
    resolved = {"cross-a-2"}  # still a lookup miss: a dead letter of d1, as before
    oracle = sorted(
        e["event_id"]
        for e in expected
        if e["event_time"].date() == d1 and e["event_id"] not in resolved
    )
    assert sorted(r["event_id"] for r in _day_rows(settings, d1)) == oracle
    after = _state(platform, d1)
    assert after["letters"] == before["letters"]  # re-rejected in place: same rows, not twice
    assert after["stats"]["rows"] == before["stats"]["rows"] == len(oracle)
    assert len(after["completions"]) == len(before["completions"]) + 1
    assert _folder_bytes(settings, d2) == bytes_d2
    with platform.engine.connect() as conn:
        assert (
            conn.execute(
                sa.select(partition_rebuilds.c.status).where(
                    partition_rebuilds.c.source == settings.source_name
                )
            ).scalar_one()
            == "DONE"
        )


def test_two_days_sharing_a_file_are_not_rebuilt_in_one_run(
    cross_day: tuple[Settings, Platform, Pipeline],
) -> None:
    """cross-a (landing on d2) fed d1 and d2: one split re-read for one day, so rebuilding
    both in one run is refused in one line, nothing changed."""
    settings, platform, _pipeline = cross_day
    d1 = settings.demo_start_date
    d2 = d1 + timedelta(days=1)
    with pytest.raises(CrossDayRebuildError, match="rebuild them in separate runs, one day each"):
        RebuildStore(platform.engine).start(
            settings.source_name, [d1, d2], "rebuilder", lease_seconds=60, event_days=True
        )
    with platform.engine.connect() as conn:
        source = settings.source_name
        assert not conn.execute(
            sa.select(partition_rebuilds.c.id).where(partition_rebuilds.c.source == source)
        ).first()
        statuses = set(
            conn.execute(sa.select(splits.c.status).where(splits.c.source == source)).scalars()
        )
    assert statuses == {"COMPLETED"}


def test_a_fixed_file_s_old_dead_letters_leave_with_the_rebuild_of_its_day(
    cross_day: tuple[Settings, Platform, Pipeline],
) -> None:
    """A landing file of d1 with a malformed line is replaced by a fixed version (registered
    as a new version: reprocess) and d1 is rebuilt: the old version's dead letters of d1 go
    with its rows, so no record is both in the output and in the dead letters (found by a
    new-user trial: the invalid-JSON line stayed after the fix and the rebuild)."""
    settings, platform, pipeline = cross_day
    d1 = settings.demo_start_date
    source = settings.source_name
    path = Path(settings.landing_path) / f"dt={d1.isoformat()}" / "cross-b.jsonl"
    with platform.engine.connect() as conn:
        (old_split,) = conn.execute(
            sa.select(splits.c.id).where(splits.c.source == source, splits.c.uri.like("%cross-b%"))
        ).scalars()
        before = conn.execute(
            sa.select(dead_letters.c.partition_key, dead_letters.c.reason).where(
                dead_letters.c.split_id == old_split
            )
        ).all()
    # The `{not json` line, tagged with its landing day d1; a lookup miss of d2.
    assert sorted(day for day, _ in before) == [d1, d1 + timedelta(days=1)]
    fixed = path.with_name(".cross-b.tmp")
    fixed.write_bytes(path.read_bytes().replace(b"{not json\n", b""))
    os.replace(fixed, path)
    reprocess = settings.model_copy(update={"file_change_policy": "reprocess"})
    demo_discover(open_platform(reprocess))
    summary = run_pipeline(reprocess, pipeline, dates=[d1], rebuild=True)
    assert summary.rebuilt == (d1.isoformat(),)
    with platform.engine.connect() as conn:
        stale = conn.execute(
            sa.select(dead_letters.c.partition_key).where(dead_letters.c.split_id == old_split)
        ).scalars()
        # d1's went with the rebuild of d1; d2's stays with d2's old rows until d2 is rebuilt.
        assert list(stale) == [d1 + timedelta(days=1)]
    letters = _state(platform, d1)["letters"]
    assert not any(b"not json" in bytes(raw) for *_, raw in letters)
    assert _state(platform, d1)["stats"]["dead_letters"] == len(letters)
