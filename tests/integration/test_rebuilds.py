"""Partition rebuilds: re-materialising a processed day replaces its output exactly, and a
run dying (or a crash at any step of the swap) never leaves it duplicated or half-replaced.
Real Postgres, real local Spark, real files."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from datetime import date
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
import sqlalchemy as sa
from conftest import TestSettings as Settings
from demo_platform import demo_discover, demo_pipeline, demo_run, prepare_demo
from landing_oracle import expected_events

from enumerator_service._operations import Platform, open_platform
from enumerator_service._rebuilds import PartitionBusyError, RebuildStore
from enumerator_service._schema import dead_letters, partition_rebuilds, splits
from spark_jobs.sink import SINKS, finish_rebuilds
from spark_jobs.sink._rebuild_swap import MARKER, REBUILDS_FOLDER, _swap, rebuild_folder

pytestmark = pytest.mark.spark

DAY = date(2026, 1, 1)
OTHER_DAY = date(2026, 1, 2)


@pytest.fixture
def processed(make_settings: Any) -> Iterator[tuple[Settings, Platform]]:
    """Two days of demo events, processed once (incrementally)."""
    settings: Settings = make_settings()
    platform = open_platform(settings)
    prepare_demo(settings, platform)
    demo_discover(platform)
    demo_run(settings)
    yield settings, platform
    platform.close()


@pytest.fixture
def processed_table(make_settings: Any) -> Iterator[tuple[Settings, Platform]]:
    """The same, into a Postgres table that appends."""
    settings: Settings = make_settings()
    platform = open_platform(settings)
    prepare_demo(settings, platform)
    demo_discover(platform)
    demo_run(settings, table=f"public.enriched_{settings.source_name}")
    yield settings, platform
    platform.close()


def folder(settings: Settings, day: date) -> Path:
    return settings.output_path / f"dt={day.isoformat()}"


def data_files(settings: Settings, day: date) -> set[str]:
    return {p.name for p in folder(settings, day).glob("*.parquet")}


def content(settings: Settings, day: date) -> tuple[int, str]:
    """Row count and a hash of the rows in event-id order (file layout does not matter)."""
    files = sorted(folder(settings, day).glob("*.parquet"))
    rows = [row for path in files for row in pq.read_table(path).to_pylist()]
    rows.sort(key=lambda row: row["event_id"])
    digest = hashlib.sha256(json.dumps(rows, default=str).encode()).hexdigest()
    return len(rows), digest


def expected_of(settings: Settings, day: date) -> int:
    events, _ = expected_events(settings.landing_path)
    return sum(1 for event in events if event["event_time"].date() == day)


def dead_letter_count(platform: Platform, settings: Settings, day: date) -> int:
    with platform.engine.connect() as conn:
        return int(
            conn.execute(
                sa.select(sa.func.count())
                .select_from(dead_letters.join(splits, dead_letters.c.split_id == splits.c.id))
                .where(splits.c.source == settings.source_name, splits.c.partition_key == day)
            ).scalar_one()
        )


def rebuild_statuses(platform: Platform, settings: Settings) -> list[str]:
    with platform.engine.connect() as conn:
        return list(
            conn.execute(
                sa.select(partition_rebuilds.c.status)
                .where(partition_rebuilds.c.source == settings.source_name)
                .order_by(partition_rebuilds.c.id)
            ).scalars()
        )


def assert_clean(settings: Settings, platform: Platform) -> None:
    """Nothing of a rebuild is left: no folders, no members, nothing held."""
    assert not (settings.output_path / REBUILDS_FOLDER).exists()
    with platform.engine.connect() as conn:
        assert not conn.execute(
            sa.select(splits.c.id).where(
                splits.c.source == settings.source_name,
                sa.or_(splits.c.rebuild_id.is_not(None), splits.c.status == "HELD"),
            )
        ).first()


def test_rebuild_replaces_a_processed_partition_exactly(
    processed: tuple[Settings, Platform],
) -> None:
    settings, platform = processed
    before, untouched = data_files(settings, DAY), data_files(settings, OTHER_DAY)
    rows_and_hash, dead = content(settings, DAY), dead_letter_count(platform, settings, DAY)
    assert rows_and_hash[0] == expected_of(settings, DAY) and dead > 0

    summary = demo_run(settings, dates=[DAY], rebuild=True)

    assert summary.rebuilt == (DAY.isoformat(),)
    assert (summary.rows_out, summary.dead_letters) == (rows_and_hash[0], dead)
    after = data_files(settings, DAY)
    assert after and not after & before  # every file was written again …
    assert content(settings, DAY) == rows_and_hash  # … with exactly the same rows
    assert data_files(settings, OTHER_DAY) == untouched
    assert dead_letter_count(platform, settings, DAY) == dead  # replaced, not added
    assert (folder(settings, DAY) / MARKER).is_file()
    assert rebuild_statuses(platform, settings) == ["DONE"]
    assert_clean(settings, platform)

    # A day never processed is simply processed; a second rebuild replaces the first.
    again = demo_run(settings, dates=[DAY, date(2026, 1, 5)], rebuild=True)
    assert again.rebuilt == (DAY.isoformat(),)
    assert content(settings, DAY) == rows_and_hash
    assert rebuild_statuses(platform, settings) == ["DONE", "DONE"]


def test_a_dead_rebuild_keeps_the_old_output_and_a_later_run_finishes_it(
    processed: tuple[Settings, Platform],
) -> None:
    settings, platform = processed
    before, rows_and_hash = data_files(settings, DAY), content(settings, DAY)
    # A run starts rebuilding DAY and dies at once (its leases expire).
    (rebuild,) = RebuildStore(platform.engine).start(
        settings.source_name, [DAY], "dead-run", lease_seconds=0
    )
    # A file landing meanwhile is held back: it is not part of the generation being rebuilt.
    late = settings.landing_path / f"dt={DAY.isoformat()}" / "late.jsonl"
    late.write_text(
        '{"event_id": "late-1", "user_id": 1, "event_time": "2026-01-01T12:00:00Z", '
        '"event_type": "click", "amount": 0}\n'
    )
    assert demo_discover(platform, dates=[DAY]).splits_registered == 1
    with platform.engine.connect() as conn:
        held = conn.execute(
            sa.select(splits.c.status).where(splits.c.uri == str(late))
        ).scalar_one()
    assert held == "HELD"
    assert data_files(settings, DAY) == before  # readers still see the old output

    # The next run (an incremental one) picks the dead rebuild's splits up and swaps it in.
    demo_run(settings)
    assert rebuild_statuses(platform, settings) == ["DONE"]
    assert content(settings, DAY) == rows_and_hash
    assert not data_files(settings, DAY) & before
    # The held file joins the new generation afterwards, once.
    demo_run(settings)
    assert content(settings, DAY)[0] == rows_and_hash[0] + 1 == expected_of(settings, DAY)
    assert_clean(settings, platform)
    assert rebuild.id > 0


def test_re_materialising_takes_over_an_abandoned_rebuild(
    processed: tuple[Settings, Platform],
) -> None:
    settings, platform = processed
    rows_and_hash = content(settings, DAY)
    RebuildStore(platform.engine).start(settings.source_name, [DAY], "dead-run", lease_seconds=0)
    summary = demo_run(settings, dates=[DAY], rebuild=True)
    assert summary.rebuilt == (DAY.isoformat(),)
    assert rebuild_statuses(platform, settings) == ["ABANDONED", "DONE"]
    assert content(settings, DAY) == rows_and_hash
    assert_clean(settings, platform)


def test_a_partition_another_live_run_reads_is_not_rebuilt(
    processed: tuple[Settings, Platform],
) -> None:
    settings, platform = processed
    with platform.engine.begin() as conn:
        conn.execute(
            sa.update(splits)
            .where(splits.c.source == settings.source_name, splits.c.partition_key == DAY)
            .values(
                status="READING",
                run_id="live-run",
                lease_expires_at=sa.func.now() + sa.text("interval '1 hour'"),
            )
        )
    with pytest.raises(PartitionBusyError, match="being read by run live-run"):
        demo_run(settings, dates=[DAY], rebuild=True)


def test_an_append_table_sink_never_rebuilds_a_processed_day(
    processed_table: tuple[Settings, Platform],
) -> None:
    """An append sink cannot replace rows: re-materialising a processed day processes only
    its new splits (none), and its rows are never written twice."""
    settings, platform = processed_table
    table = f"public.enriched_{settings.source_name}"
    with platform.engine.connect() as conn:
        before = conn.execute(sa.text(f"SELECT count(*) FROM {table}")).scalar_one()
    summary = demo_run(settings, table=table, dates=[DAY], rebuild=True)
    assert summary.nothing_new and summary.rebuilt == ()
    with platform.engine.connect() as conn:
        assert conn.execute(sa.text(f"SELECT count(*) FROM {table}")).scalar_one() == before


@pytest.mark.parametrize("crash", ["before_swap", "swapping", "exchanged", "done"])
def test_a_crash_at_any_step_of_the_swap_is_finished_exactly_once(
    processed: tuple[Settings, Platform], monkeypatch: pytest.MonkeyPatch, crash: str
) -> None:
    settings, platform = processed
    before, rows_and_hash = data_files(settings, DAY), content(settings, DAY)
    dead = dead_letter_count(platform, settings, DAY)
    # The rebuild run completes every member, then "crashes" before swapping.
    monkeypatch.setattr(
        "spark_jobs.connectors.parquet.ParquetConnector.finish_rebuilds", lambda *a, **k: []
    )
    with pytest.raises(RuntimeError, match="not complete"):
        demo_run(settings, dates=[DAY], rebuild=True)
    monkeypatch.undo()
    store = RebuildStore(platform.engine)
    (rebuild,) = store.ready(settings.source_name)
    new = settings.output_path / rebuild_folder(DAY.isoformat(), rebuild.id)
    if crash in ("swapping", "exchanged", "done"):
        assert store.begin_swap(rebuild)
    if crash in ("exchanged", "done"):
        _swap(new, folder(settings, DAY), rebuild.id)
    if crash == "done":
        store.end_swap(rebuild)
    # Whatever a reader sees now is one whole generation, never a mix.
    assert data_files(settings, DAY) == before or not data_files(settings, DAY) & before
    assert content(settings, DAY) == rows_and_hash

    finish_rebuilds(platform.engine, settings.output_path, SINKS, source=settings.source_name)
    finish_rebuilds(platform.engine, settings.output_path, SINKS, source=settings.source_name)

    assert rebuild_statuses(platform, settings) == ["DONE"]
    assert not data_files(settings, DAY) & before
    assert content(settings, DAY) == rows_and_hash
    assert dead_letter_count(platform, settings, DAY) == dead
    assert_clean(settings, platform)


def test_a_rebuild_with_different_results_replaces_rows_and_dead_letters(
    make_settings: Any,
) -> None:
    """Generation 0 rejects the longer half of the lines (a small max_line_bytes); the rebuild
    accepts them: the day's rows, its dead letters and the checks' accounting all follow the
    new generation, nothing of the old one remains."""
    from dagster_project._counts import partition_counts

    settings: Settings = make_settings()
    platform = open_platform(settings)
    try:
        prepare_demo(settings, platform)
        lengths = sorted(
            len(line)
            for path in (settings.landing_path / f"dt={DAY.isoformat()}").glob("*.jsonl")
            for line in path.read_bytes().splitlines()
        )
        strict = make_settings(
            source_name=settings.source_name, max_line_bytes=lengths[len(lengths) // 2]
        )
        demo_discover(platform)
        demo_run(strict, dates=[DAY])
        rows0, dead0 = content(settings, DAY)[0], dead_letter_count(platform, settings, DAY)
        expected = expected_of(settings, DAY)
        assert rows0 < expected and dead0 > len(lengths) // 3  # the long half was rejected

        summary = demo_run(settings, dates=[DAY], rebuild=True)

        assert summary.rebuilt == (DAY.isoformat(),)
        assert content(settings, DAY)[0] == summary.rows_out == expected
        dead1 = dead_letter_count(platform, settings, DAY)
        assert dead1 == summary.dead_letters < dead0  # the stale rejections are gone
        (counts,) = partition_counts(demo_pipeline(settings), settings, [DAY])
        assert (counts.rows_out, counts.rows_committed, counts.dead_letters) == (
            expected,
            expected,
            dead1,
        )
        assert counts.reconciles
        assert_clean(settings, platform)
    finally:
        platform.close()
