"""Split enumerators on a real Postgres: bounded and continuous discovery, the reader
protocol (register, request, give back), checkpoint restore, byte-range cutting."""

from __future__ import annotations

import os
from collections.abc import Iterator
from datetime import date
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from enumerator_service import (
    ContinuousFileEnumerator,
    Settings,
    StaticFileEnumerator,
    modification_time,
)
from enumerator_service._operations import Platform, open_platform
from spark_jobs.source import FormatRouter, RecordSchema

#: The field every landed test record has.
NUMBERED = RecordSchema((pa.field("n", pa.int64()),), frozenset({"n"}))


@pytest.fixture
def platform(make_settings: Any) -> Iterator[Platform]:
    settings: Settings = make_settings()
    p = open_platform(settings)
    yield p
    p.close()


def _land(landing: Path, day: str, name: str, lines: int, mtime: float | None = None) -> Path:
    folder = landing / f"dt={day}"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text("".join(f'{{"n": {i}, "pad": "{"x" * (i % 37)}"}}\n' for i in range(lines)))
    if mtime is not None:
        os.utime(path, (mtime, mtime))
    return path


def _read_numbers(enumerator: StaticFileEnumerator, *, block_bytes: int) -> list[int]:
    """The ``n`` of every record of the splits reader 0 is handed, in order."""
    router = FormatRouter(NUMBERED, max_line_bytes=1 << 20, dsn="unused", block_bytes=block_bytes)
    numbers: list[int] = []
    try:
        while (assignment := enumerator.handle_split_request(0)) is not None:
            router.add_split(assignment)
            while router.has_splits():
                for block in router.fetch().blocks:
                    assert not block.dead
                    numbers.extend(block.rows.column("n").to_pylist())
    finally:
        router.close()
    return numbers


def _continuous(platform: Platform, **kw: Any) -> ContinuousFileEnumerator:
    s = platform.settings
    return ContinuousFileEnumerator(platform.engine, s.source_name, s.landing_path, **kw)


def test_splits_discovered_while_no_reader_is_registered_are_kept(platform: Platform) -> None:
    landing = platform.settings.landing_path
    _land(landing, "2026-01-01", "a.jsonl", 5)
    enumerator = _continuous(platform)
    assert enumerator.start("run-1").splits_registered == 1  # no reader yet
    _land(landing, "2026-01-01", "b.jsonl", 5)
    assert enumerator.discover().splits_registered == 1
    assert enumerator.assign_pending() == 2
    enumerator.add_reader(0)
    got = [enumerator.handle_split_request(0), enumerator.handle_split_request(0)]
    assert sorted(Path(a.split.path).name for a in got if a is not None) == ["a.jsonl", "b.jsonl"]
    assert enumerator.handle_split_request(0) is None


def test_a_requesting_reader_that_has_gone_away_gets_nothing(platform: Platform) -> None:
    _land(platform.settings.landing_path, "2026-01-01", "a.jsonl", 5)
    enumerator = _continuous(platform)
    enumerator.start("run-2")
    enumerator.assign_pending()
    assert enumerator.handle_split_request(3) is None  # never registered
    enumerator.add_reader(3)
    enumerator.remove_reader(3)
    assert enumerator.handle_split_request(3) is None  # gone
    enumerator.add_reader(4)
    assert enumerator.handle_split_request(4) is not None


def test_a_reader_gets_several_small_discovered_files_in_one_request(platform: Platform) -> None:
    landing = platform.settings.landing_path
    for name in ("a.jsonl", "b.jsonl", "c.jsonl"):
        _land(landing, "2026-01-01", name, 5)
    enumerator = _continuous(platform)
    enumerator.start("run-batch")
    assert enumerator.assign_pending() == 3
    assert enumerator.handle_split_requests(1, max_splits=8, max_bytes=1 << 20) == []  # unknown
    enumerator.add_reader(1)
    got = enumerator.handle_split_requests(1, max_splits=8, max_bytes=1 << 20)
    assert [Path(a.split.path).name for a in got] == ["a.jsonl", "b.jsonl", "c.jsonl"]
    assert enumerator.handle_split_requests(1, max_splits=8, max_bytes=1 << 20) == []


def test_restore_gives_back_only_the_hand_outs_after_the_completed_checkpoint(
    platform: Platform,
) -> None:
    landing = platform.settings.landing_path
    for i in range(4):
        _land(landing, "2026-01-02", f"p{i}.jsonl", 3)
    enumerator = _continuous(platform)
    enumerator.start("run-3")
    enumerator.assign_pending()
    enumerator.add_reader(0)
    first = enumerator.handle_split_request(0)
    assert first is not None
    assert enumerator.snapshot_state(1)["captured"] == 1
    enumerator.notify_checkpoint_complete(1)
    later = [enumerator.handle_split_request(0), enumerator.handle_split_request(0)]
    returned = enumerator.restore(0)
    assert returned == sorted(a.split_id for a in later if a is not None)
    assert enumerator.store.counts(platform.settings.source_name) == {"READING": 1, "ASSIGNED": 3}
    # add_splits_back: the failed reader's remaining split goes back too, and it is gone.
    assert enumerator.add_splits_back([first.split_id], 0) == 1
    assert enumerator.handle_split_request(0) is None


def test_the_cursor_stays_bounded_by_the_lookback_window(platform: Platform) -> None:
    landing = platform.settings.landing_path
    for i in range(20):
        _land(landing, "2026-01-03", f"old{i}.jsonl", 1, mtime=1_000_000.0 + i)
    # Made-up mtimes (utime sets the ctime to now): the cursor orders by those here.
    enumerator = _continuous(platform, lookback_seconds=5.0, file_time=modification_time)
    assert enumerator.discover().splits_registered == 20
    _land(landing, "2026-01-03", "new.jsonl", 1, mtime=2_000_000.0)
    tick = enumerator.discover()
    assert tick.splits_registered == 1
    assert tick.cursor["recent_paths"] == [str(landing / "dt=2026-01-03" / "new.jsonl")]
    assert enumerator.discover().splits_registered == 0


def test_static_enumerator_lists_only_the_requested_dates(platform: Platform) -> None:
    s = platform.settings
    _land(s.landing_path, "2026-01-01", "a.jsonl", 2)
    _land(s.landing_path, "2026-01-02", "b.jsonl", 2)
    enumerator = StaticFileEnumerator(
        platform.engine, s.source_name, s.landing_path, dates=[date(2026, 1, 2)]
    )
    result = enumerator.discover()
    assert (result.files_seen, result.splits_registered) == (1, 1)
    assert enumerator.discover().splits_registered == 0


def test_large_files_are_cut_into_byte_ranges_that_read_every_line_once(
    platform: Platform,
) -> None:
    s = platform.settings
    path = _land(s.landing_path, "2026-01-04", "big.jsonl", 2000)
    size = path.stat().st_size
    enumerator = StaticFileEnumerator(
        platform.engine, s.source_name, s.landing_path, target_split_bytes=4096
    )
    assert enumerator.discover().splits_registered == -(-size // 4096)
    enumerator.start("run-4")
    enumerator.assign_pending()
    enumerator.add_reader(0)
    assert _read_numbers(enumerator, block_bytes=1000) == list(range(2000))


def test_large_parquet_files_are_cut_at_row_groups_and_read_every_row_once(
    platform: Platform,
) -> None:
    s = platform.settings
    folder = s.landing_path / "dt=2026-01-06"
    folder.mkdir(parents=True)
    path = folder / "rows.parquet"
    table = pa.table({"n": list(range(5000)), "pad": [f"{i:040d}" for i in range(5000)]})
    pq.write_table(table, path, row_group_size=250, compression="none")  # 20 row groups
    enumerator = StaticFileEnumerator(
        platform.engine, s.source_name, s.landing_path, target_split_bytes=20_000
    )
    registered = enumerator.discover().splits_registered
    assert registered > 3
    enumerator.start("run-5")
    enumerator.assign_pending()
    enumerator.add_reader(0)
    assert _read_numbers(enumerator, block_bytes=1000) == list(range(5000))
