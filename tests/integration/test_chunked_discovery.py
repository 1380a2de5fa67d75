"""Capped discovery ticks on a real Postgres: a backlog larger than the per-tick cap is drained
over several ticks, every file registered exactly once, chunk boundaries exact even inside
one modification time, and the drained cursor identical to one uncapped tick's.

"Registered once" is checked on what the enumerator *offers* the split store, not only on the
rows it holds: the store ignores duplicates (ON CONFLICT DO NOTHING) and would hide them.
"""

from __future__ import annotations

import os
import random
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from demo_platform import demo_discover

from enumerator_service import (
    ContinuousFileEnumerator,
    DiscoveryResult,
    Split,
    load_settings,
    modification_time,
)
from enumerator_service._operations import Platform, open_platform
from enumerator_service._schema import splits

T0 = 1_767_225_600.0  # 2026-01-01T00:00:00Z: a fixed base for the files' mtimes


@pytest.fixture
def platform(make_settings: Any) -> Iterator[Platform]:
    p = open_platform(make_settings())
    yield p
    p.close()


def land(landing: Path, name: str, mtime: float, day: str = "2026-01-01") -> str:
    folder = landing / f"dt={day}"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text('{"n": 1}\n')
    os.utime(path, (mtime, mtime))
    return str(path.absolute())


class Recorder:
    """A continuous enumerator whose every ``register`` call is recorded (paths, in order)."""

    def __init__(self, platform: Platform, source: str, cap: int | None, **kw: Any) -> None:
        self.enumerator = ContinuousFileEnumerator(
            platform.engine,
            source,
            platform.settings.landing_path,
            max_files_per_tick=cap,
            # The files get made-up mtimes (utime sets their ctime to now): order by those.
            file_time=modification_time,
            **kw,
        )
        self.offered: list[list[str]] = []
        store = self.enumerator.store
        register = store.register

        def recording(new_splits: Sequence[Split], **kwargs: Any) -> int:
            batch = list(new_splits)
            self.offered.append([getattr(split, "path", "") for split in batch])
            return register(batch, **kwargs)

        store.register = recording  # type: ignore[method-assign]

    def tick(self) -> DiscoveryResult:
        return self.enumerator.discover()

    def drain(self, limit: int = 100) -> list[DiscoveryResult]:
        results = [self.tick()]
        while not results[-1].complete:
            assert len(results) < limit, "the backlog does not shrink"
            results.append(self.tick())
        return results

    @property
    def all_offered(self) -> list[str]:
        return [path for batch in self.offered for path in batch]


def registered_paths(platform: Platform, source: str) -> list[str]:
    stmt = sa.select(splits.c.uri).where(splits.c.source == source).order_by(splits.c.id)
    with platform.engine.connect() as conn:
        return list(conn.execute(stmt).scalars())


def test_a_backlog_is_drained_oldest_first_in_chunks_of_the_cap(platform: Platform) -> None:
    landing = platform.settings.landing_path
    paths = [land(landing, f"f{i:02d}.jsonl", T0 + i) for i in range(10)]
    source = platform.settings.source_name
    recorder = Recorder(platform, source, cap=3)

    results = recorder.drain()

    assert [r.splits_registered for r in results] == [3, 3, 3, 1]
    assert [r.backlog_files for r in results] == [7, 4, 1, 0]
    assert [r.files_seen for r in results] == [10] * 4
    # Each tick took the next files in mtime order, and none was offered twice.
    assert recorder.offered == [paths[0:3], paths[3:6], paths[6:9], paths[9:10]]
    assert registered_paths(platform, source) == paths
    # The cursor reports the backlog and where the next tick goes on.
    assert results[0].cursor["backlog_files"] == 7
    assert results[0].cursor["resume_after"] == [T0 + 2, paths[2]]
    assert "backlog_files" not in results[-1].cursor
    # Drained: the next tick finds nothing and offers nothing.
    again = recorder.tick()
    assert (again.splits_registered, again.backlog_files) == (0, 0)
    assert recorder.offered[-1] == []


def test_files_sharing_one_mtime_are_split_exactly_at_a_chunk_boundary(
    platform: Platform,
) -> None:
    landing = platform.settings.landing_path
    older = land(landing, "a-older.jsonl", T0 - 5)
    same = sorted(land(landing, f"s{i}.jsonl", T0, day=f"2026-01-0{1 + i % 3}") for i in range(7))
    newer = land(landing, "z-newer.jsonl", T0 + 5)
    source = platform.settings.source_name
    recorder = Recorder(platform, source, cap=3)

    results = recorder.drain()

    # The order is (mtime, path): the boundaries fall inside the group of equal mtimes.
    order = [older, *same, newer]
    assert recorder.offered == [order[0:3], order[3:6], order[6:9]]
    assert [r.backlog_files for r in results] == [6, 3, 0]
    assert results[0].cursor["resume_after"] == [T0, same[1]]
    assert sorted(registered_paths(platform, source)) == sorted(order)
    assert len(recorder.all_offered) == len(set(recorder.all_offered)) == len(order)


def test_files_arriving_during_a_drain_are_taken_in_order_and_once(platform: Platform) -> None:
    landing = platform.settings.landing_path
    backlog = [land(landing, f"b{i}.jsonl", T0 + i) for i in range(6)]
    source = platform.settings.source_name
    recorder = Recorder(platform, source, cap=2, lookback_seconds=600.0)

    first = recorder.tick()
    assert first.backlog_files == 4
    # While the backlog drains: a late file (older than the position reached, inside the
    # lookback window) and a new one (newest of all).
    late = land(landing, "late.jsonl", T0 - 100)
    new = land(landing, "new.jsonl", T0 + 50)
    results = [first, *recorder.drain()]

    assert (
        recorder.offered
        == [
            backlog[0:2],
            [late, backlog[2]],  # the late file is older: it comes first
            backlog[3:5],
            [backlog[5], new],
        ]
    )
    assert [r.backlog_files for r in results] == [4, 4, 2, 0]
    assert sorted(registered_paths(platform, source)) == sorted([*backlog, late, new])


def test_the_cursor_stays_bounded_while_a_backlog_drains(platform: Platform) -> None:
    landing = platform.settings.landing_path
    # 30 files 100 s apart; a 250 s lookback window holds at most 3 of them.
    for i in range(30):
        land(landing, f"f{i:02d}.jsonl", T0 + 100 * i)
    recorder = Recorder(platform, platform.settings.source_name, cap=4, lookback_seconds=250.0)

    results = recorder.drain()

    assert len(results) == 8
    assert max(len(r.cursor["recent_paths"]) for r in results) <= 3
    assert len(recorder.all_offered) == len(set(recorder.all_offered)) == 30


@pytest.mark.parametrize("seed", range(6))
def test_a_drained_backlog_ends_where_one_uncapped_tick_ends(platform: Platform, seed: int) -> None:
    """Random mtimes with many ties, a random cap: the same files, each once, and the same
    final cursor as one tick without a cap (on a second source over the same files)."""
    rng = random.Random(seed)
    landing = platform.settings.landing_path
    files = {
        land(landing, f"f{i:03d}-{rng.randrange(10**6)}.jsonl", T0 + rng.randrange(8) * 60.0)
        for i in range(rng.randrange(20, 60))
    }
    source = platform.settings.source_name
    capped = Recorder(platform, source, cap=rng.randrange(1, 9), lookback_seconds=120.0)
    uncapped = Recorder(platform, f"{source}_ref", cap=None, lookback_seconds=120.0)

    drained = capped.drain()
    reference = uncapped.tick()

    assert sorted(capped.all_offered) == sorted(files)
    assert len(capped.all_offered) == len(files)
    assert sum(r.splits_registered for r in drained) == reference.splits_registered
    assert drained[-1].cursor == reference.cursor
    # Offered in (mtime, path) order across ticks.
    mtimes = [os.stat(path).st_mtime for path in capped.all_offered]
    assert list(zip(mtimes, capped.all_offered, strict=True)) == sorted(
        zip(mtimes, capped.all_offered, strict=True)
    )


def test_the_platform_tick_applies_the_configured_cap(make_settings: Any) -> None:
    settings = make_settings(discovery_max_files_per_tick=2)
    for i in range(5):
        land(settings.landing_path, f"f{i}.jsonl", T0 + i)
    platform = open_platform(settings)
    try:
        ticks = [demo_discover(platform) for _ in range(4)]
    finally:
        platform.close()
    assert [(t.splits_registered, t.backlog_files) for t in ticks] == [
        (2, 3),
        (2, 1),
        (1, 0),
        (0, 0),
    ]


def test_a_bad_cap_fails_fast_naming_the_setting(platform: Platform) -> None:
    from enumerator_service import ConfigError

    with pytest.raises(ConfigError) as error:
        load_settings(discovery_max_files_per_tick=0)
    assert str(error.value).startswith("SLUICE_DISCOVERY_MAX_FILES_PER_TICK: ")
    assert "\n" not in str(error.value)
    with pytest.raises(ValueError, match="max_files_per_tick"):
        ContinuousFileEnumerator(
            platform.engine, "x", platform.settings.landing_path, max_files_per_tick=0
        )
