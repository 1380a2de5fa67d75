"""Partition completeness end to end (real Postgres, real local Spark, real files): a bounded
run completes each event day once at end of input with the committed counts; a file landing
late for a complete day is dead-lettered (reason ``late``) or reopens the day (generation 2)
per the pipeline's ``late_records``; one landing file feeds several event-day partitions."""

from __future__ import annotations

import dataclasses
from collections import Counter
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

from enumerator_service._operations import Platform, open_platform
from enumerator_service._schema import (
    dead_letters,
    partition_completions,
    partition_rebuilds,
    partition_stats,
    splits,
)
from spark_jobs import Pipeline
from spark_jobs.jobs import run_pipeline

pytestmark = pytest.mark.spark


@pytest.fixture
def prepared(make_settings: Any) -> Iterator[tuple[Settings, Platform]]:
    settings: Settings = make_settings(demo_events=240, demo_days=2, demo_files_per_day=2)
    platform = open_platform(settings)
    prepare_demo(settings, platform)
    yield settings, platform
    platform.close()


def _pipeline(settings: Settings, policy: str) -> Pipeline:
    pipeline = demo_pipeline(settings)
    return dataclasses.replace(
        pipeline, source=dataclasses.replace(pipeline.source, late_records=policy)
    )


def _completions(platform: Platform) -> list[Any]:
    with platform.engine.connect() as conn:
        return conn.execute(
            sa.select(partition_completions)
            .where(partition_completions.c.source == platform.settings.source_name)
            .order_by(partition_completions.c.partition_key, partition_completions.c.generation)
        ).all()


def _late_file(settings: Settings, folder: date, name: str, times: list[datetime]) -> None:
    """A file landing in ``dt=<folder>`` after that day was processed."""
    lines = [
        orjson.dumps(
            {
                "event_id": f"late-{name}-{i}",
                "user_id": 1,
                "event_time": when.isoformat(),
                "event_type": "click",
                "amount": 0.0,
            }
        )
        for i, when in enumerate(times)
    ]
    path = Path(settings.landing_path) / f"dt={folder.isoformat()}" / f"{name}.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")


def _midnight(day: date) -> datetime:
    return datetime(day.year, day.month, day.day, tzinfo=UTC)


def _output(settings: Settings) -> list[dict[str, Any]]:
    dataset = ds.dataset(settings.output_path, format="parquet", partitioning="hive")
    return dataset.to_table().to_pylist()


def test_a_bounded_run_completes_each_event_day_once_and_late_files_follow_the_policy(
    prepared: tuple[Settings, Platform],
) -> None:
    settings, platform = prepared
    d1 = settings.demo_start_date
    d2, d3 = d1 + timedelta(days=1), d1 + timedelta(days=2)
    demo_discover(platform)
    strict = _pipeline(settings, "dead_letter")
    run_pipeline(settings, strict)
    expected, _malformed = expected_events(settings.landing_path)
    per_day = Counter(e["event_time"].date() for e in expected)
    first = _completions(platform)
    assert [(c.partition_key, c.generation) for c in first] == [(d1, 1), (d2, 1)]
    # d2, the last day, completes at end of input (+infinity); d1 too, or at a checkpoint
    # whose watermark had passed its end while the run read d2's files (timing decides).
    assert first[1].watermark is None
    assert first[0].watermark is None or first[0].watermark >= _midnight(d2)
    assert [c.rows for c in first] == [per_day[d1], per_day[d2]]
    assert sum(c.dead_letters for c in first) > 0  # malformed lines, on their landing day

    # A file lands in dt=d1 after d1 completed: two d1 events (late) and one of d3 (a new
    # partition fed by a d1 landing file).
    noon = datetime(d1.year, d1.month, d1.day, 12, tzinfo=UTC)
    _late_file(settings, d1, "late-a", [noon, noon + timedelta(hours=1), noon + timedelta(days=2)])
    demo_discover(platform)
    run_pipeline(settings, strict)
    second = _completions(platform)
    assert [(c.partition_key, c.generation) for c in second] == [(d1, 1), (d2, 1), (d3, 1)]
    assert second[2].rows == 1
    with platform.engine.connect() as conn:
        late = conn.execute(
            sa.select(dead_letters.c.reason, dead_letters.c.offset).where(
                dead_letters.c.source == settings.source_name, dead_letters.c.reason == "late"
            )
        ).all()
        stats = conn.execute(
            sa.select(partition_stats.c.late_records, partition_stats.c.open).where(
                partition_stats.c.source == settings.source_name,
                partition_stats.c.partition_key == d1,
            )
        ).one()
    assert len(late) == 2
    assert tuple(stats) == (2, False)  # dead-lettered: the day is not reopened
    rows = _output(settings)
    assert sum(1 for r in rows if r["event_id"].startswith("late-late-a")) == 1
    assert {str(r["dt"]) for r in rows if r["event_id"].startswith("late-")} == {str(d3)}

    # Under "reopen" the next late file's d1 rows are written, and d1 completes again.
    _late_file(settings, d1, "late-b", [noon, noon + timedelta(minutes=5)])
    demo_discover(platform)
    run_pipeline(settings, _pipeline(settings, "reopen"))
    third = _completions(platform)
    assert [(c.partition_key, c.generation) for c in third] == [
        (d1, 1),
        (d1, 2),
        (d2, 1),
        (d3, 1),
    ]
    reopened = third[1]
    assert (reopened.rows, reopened.late_records) == (per_day[d1] + 2, 4)
    rows = _output(settings)
    assert {str(r["dt"]) for r in rows if r["event_id"].startswith("late-late-b")} == {str(d1)}
    assert len(rows) == len(expected) + 1 + 2

    # A d1 event in a d2 file, then d1 re-materialised: the rebuild re-reads the d2 file
    # too, and (never late) writes every d1 record of every file, late ones included.
    _late_file(settings, d2, "late-c", [noon + timedelta(hours=3)])
    demo_discover(platform)
    run_pipeline(settings, _pipeline(settings, "reopen"))
    summary = run_pipeline(settings, _pipeline(settings, "reopen"), dates=[d1], rebuild=True)
    assert summary.rebuilt == (d1.isoformat(),)
    d1_rows = [r for r in _output(settings) if str(r["dt"]) == str(d1)]
    assert len(d1_rows) == per_day[d1] + 2 + 2 + 1  # late-a's two d1 records now written
    with platform.engine.connect() as conn:
        assert not conn.execute(  # late-a's late dead letters went with the old generation
            sa.select(dead_letters.c.id).where(
                dead_letters.c.source == settings.source_name, dead_letters.c.reason == "late"
            )
        ).first()
        assert (
            conn.execute(
                sa.select(partition_rebuilds.c.status).where(
                    partition_rebuilds.c.source == settings.source_name
                )
            ).scalar_one()
            == "DONE"
        )
    # late-c reopened d1 (generation 3); the swap records generation 4 with the new counts.
    final = [c for c in _completions(platform) if c.partition_key == d1]
    assert [c.generation for c in final] == [1, 2, 3, 4]
    assert (final[3].rows, final[3].late_records) == (len(d1_rows), 0)


def test_a_restored_range_judges_its_late_records_once(make_settings: Any) -> None:
    """A range in flight at the committed checkpoint is re-read after a restore: its records
    of a complete day are dead-lettered (reason late) and counted exactly once."""
    settings: Settings = make_settings()
    platform = open_platform(settings)
    try:
        prepare_demo(settings, platform, events=False)
        day = date(2026, 1, 3)
        folder = settings.landing_path / f"dt={day}"
        folder.mkdir(parents=True)
        lines = [
            orjson.dumps(
                {
                    "event_id": f"r{i}",
                    "user_id": i + 1,
                    "event_time": f"2026-01-03T00:00:0{i}+00:00",
                    "event_type": "click",
                    "amount": float(i),
                }
            )
            + b"\n"
            for i in range(10)
        ]
        (folder / "a.jsonl").write_bytes(b"".join(lines))
        assert demo_discover(platform).splits_registered == 1
        starts = [sum(len(line) for line in lines[:i]) for i in range(11)]
        source = settings.source_name
        with platform.engine.begin() as conn:
            # Committed: lines 0-3 emitted, the block of lines 4-6 in flight, 7-9 not read;
            # and the day was completed meanwhile (by another run).
            conn.execute(
                sa.update(splits)
                .where(splits.c.source == source)
                .values(committed_offset=starts[7], pending=[{"span": [starts[4], starts[7]]}])
            )
            conn.execute(
                sa.insert(partition_stats).values(
                    source=source, partition_key=day, rows=4, generation=1, open=False
                )
            )
            conn.execute(
                sa.insert(partition_completions).values(
                    source=source,
                    partition_key=day,
                    generation=1,
                    run_id="earlier",
                    checkpoint_id=1,
                    rows=4,
                    dead_letters=0,
                    late_records=0,
                )
            )
        summary = run_pipeline(settings, _pipeline(settings, "dead_letter"))
        assert (summary.rows_out, summary.dead_letters) == (0, 6)
        with platform.engine.connect() as conn:
            late = conn.execute(
                sa.select(dead_letters.c.offset)
                .where(dead_letters.c.source == source, dead_letters.c.reason == "late")
                .order_by(dead_letters.c.offset)
            ).scalars()
            assert list(late) == starts[4:10]
            stats = conn.execute(
                sa.select(
                    partition_stats.c.rows,
                    partition_stats.c.dead_letters,
                    partition_stats.c.late_records,
                    partition_stats.c.open,
                ).where(partition_stats.c.source == source)
            ).one()
        assert tuple(stats) == (4, 6, 6, False)
        assert [(c.partition_key, c.generation) for c in _completions(platform)] == [(day, 1)]
    finally:
        platform.close()


def test_an_at_least_once_run_completes_its_days_with_the_committed_counts(
    make_settings: Any,
) -> None:
    settings: Settings = make_settings(
        demo_events=120, demo_days=2, demo_files_per_day=1, checkpointing_mode="AT_LEAST_ONCE"
    )
    platform = open_platform(settings)
    try:
        prepare_demo(settings, platform)
        demo_discover(platform)
        run_pipeline(settings, _pipeline(settings, "reopen"))
        expected, _malformed = expected_events(settings.landing_path)
        per_day = Counter(e["event_time"].date() for e in expected)
        done = _completions(platform)
        assert [(c.partition_key, c.generation, c.rows) for c in done] == [
            (day, 1, per_day[day]) for day in sorted(per_day)
        ]
    finally:
        platform.close()


def test_a_steps_dead_letter_counts_on_its_event_day(
    prepared: tuple[Settings, Platform],
) -> None:
    """A lookup miss (dead-lettered by the step) counts on the record's event day; a line the
    reader cannot parse counts on its file's landing day."""
    settings, platform = prepared
    d1 = settings.demo_start_date
    d2, d3 = d1 + timedelta(days=1), d1 + timedelta(days=2)
    folder = Path(settings.landing_path) / f"dt={d2.isoformat()}"
    record = {
        "event_id": "miss-1",
        "user_id": 999_999,  # no such user: a lookup miss
        "event_time": datetime.combine(d3, datetime.min.time(), UTC).isoformat(),
        "event_type": "click",
        "amount": 1.0,
    }
    (folder / "miss.jsonl").write_bytes(orjson.dumps(record) + b"\n{not json\n")
    pipeline = demo_pipeline(settings)
    lookup = dataclasses.replace(pipeline.steps[0], on_miss="dead_letter")
    demo_discover(platform)
    run_pipeline(settings, dataclasses.replace(pipeline, steps=[lookup, *pipeline.steps[1:]]))
    source = settings.source_name
    with platform.engine.connect() as conn:
        stats = dict(
            conn.execute(
                sa.select(partition_stats.c.partition_key, partition_stats.c.dead_letters).where(
                    partition_stats.c.source == source
                )
            ).all()
        )
        letters = conn.execute(
            sa.select(dead_letters.c.raw, dead_letters.c.reason, splits.c.partition_key)
            .join(splits, splits.c.id == dead_letters.c.split_id)
            .where(dead_letters.c.source == source)
        ).all()
    assert stats[d3] == 1  # the miss: landed on d2, its event day is d3
    assert any(r.reason.startswith("lookup miss") and b"miss-1" in r.raw for r in letters)
    # Every dead letter is counted once, on its record's event day or else its landing day.
    assert sum(stats.values()) == len(letters)
    readers = sum(1 for r in letters if not r.reason.startswith("lookup miss"))
    misses_d2 = sum(
        1
        for r in letters
        if r.reason.startswith("lookup miss")
        and datetime.fromisoformat(orjson.loads(r.raw)["event_time"]).astimezone(UTC).date() == d2
    )
    landed_d2 = sum(
        1 for r in letters if r.partition_key == d2 and not r.reason.startswith("lookup miss")
    )
    assert readers >= 1 and stats[d2] == landed_d2 + misses_d2
