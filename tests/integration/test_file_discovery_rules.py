"""Discovery of landing files that are still being written, moved in with an old mtime, or
changed after they were registered (issue 21, "files are immutable or detected"): the settle
rule (a virtual clock, no sleeps), the change-time cursor, new versions of a changed file
under the ``refuse`` and ``reprocess`` policies, and ``retry`` re-reading a file as it is
now. Real Postgres; no Spark."""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import TestSettings

from enumerator_service import (
    ChangePolicy,
    ContinuousFileEnumerator,
    FileIdentity,
    SplitStore,
    StaticFileEnumerator,
)
from enumerator_service._file_identity import CHANGED_REASON, current
from enumerator_service._operations import Platform, open_platform
from enumerator_service._quarantine import quarantined, retry_splits

MakeSettings = Callable[..., TestSettings]
DAY = "2026-01-01"


@pytest.fixture
def platform(make_settings: MakeSettings) -> Iterator[Platform]:
    p = open_platform(make_settings())
    yield p
    p.close()


class Clock:
    """A virtual wall clock (seconds since the epoch)."""

    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def _landing(platform: Platform) -> Path:
    settings = platform.settings
    assert isinstance(settings, TestSettings)
    folder = settings.landing_path / f"dt={DAY}"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def _write(path: Path, n: int, *, start: int = 0) -> Path:
    path.write_bytes(b"".join(b'{"n": %d}\n' % i for i in range(start, start + n)))
    return path


def _identity(path: Path) -> FileIdentity:
    found = current(str(path))
    assert found is not None
    return found


def _continuous(platform: Platform, **kw: Any) -> ContinuousFileEnumerator:
    s = platform.settings
    assert isinstance(s, TestSettings)
    return ContinuousFileEnumerator(platform.engine, s.source_name, s.landing_path, **kw)


def _rows(platform: Platform) -> list[dict[str, Any]]:
    with platform.engine.connect() as conn:
        rows = conn.exec_driver_sql(
            "SELECT id, uri, status, end_offset, file_size, file_inode, file_version,"
            " failure_reason, last_error FROM sluice.splits WHERE source = %s ORDER BY id",
            (platform.settings.source_name,),
        ).all()
    return [dict(r._mapping) for r in rows]


def test_a_file_still_being_written_is_registered_only_once_it_settled(
    platform: Platform,
) -> None:
    """Issue 21 row 4: a file discovered while being written was cut at the size seen."""
    folder = _landing(platform)
    path = folder / "growing.jsonl"
    path.write_bytes(_write(path, 2000).read_bytes() + b'{"n": 20')  # a half-written line
    clock = Clock(_identity(path).changed_at + 1.0)  # written a second ago
    enumerator = _continuous(platform, settle_seconds=5.0, clock=clock)
    first = enumerator.discover()
    assert (first.splits_registered, first.unsettled_files, first.backlog_files) == (0, 1, 0)
    assert first.complete  # not a backlog: a command does not loop on it
    assert first.cursor["recent_paths"] == []
    with path.open("ab") as file:  # the writer finishes the line and goes on
        file.write(b"00}\n" + b"".join(b'{"n": %d}\n' % i for i in range(2001, 4000)))
    clock.now = _identity(path).changed_at + 4.9
    assert enumerator.discover().unsettled_files == 1  # still within the settle time
    clock.now += 0.2
    settled = enumerator.discover()
    assert (settled.splits_registered, settled.unsettled_files) == (1, 0)
    (row,) = _rows(platform)
    identity = _identity(path)
    assert row["end_offset"] == row["file_size"] == identity.size  # the whole file
    assert (row["file_inode"], row["file_version"]) == (identity.inode, 0)
    assert enumerator.discover().splits_registered == 0


def test_a_static_listing_settles_files_too(platform: Platform) -> None:
    folder = _landing(platform)
    path = _write(folder / "a.jsonl", 10)
    s = platform.settings
    assert isinstance(s, TestSettings)
    clock = Clock(_identity(path).changed_at + 1.0)
    static = StaticFileEnumerator(
        platform.engine, s.source_name, s.landing_path, settle_seconds=2.0, clock=clock
    )
    assert (static.discover().splits_registered, static.discover().unsettled_files) == (0, 1)
    clock.now += 1.5
    assert static.discover().splits_registered == 1


def _move_in(how: str, source: Path, target: Path) -> None:
    if how == "mv":
        subprocess.run(["mv", str(source), str(target)], check=True)
    elif how == "cp -p":
        subprocess.run(["cp", "-p", str(source), str(target)], check=True)
    else:  # rsync -a: a hidden temporary file with the source's mtime, renamed into place
        temporary = target.with_name(f".{target.name}.XXXXXX")
        shutil.copy2(source, temporary)
        os.rename(temporary, target)


def test_files_moved_in_with_an_old_mtime_are_discovered(
    platform: Platform, tmp_path: Path
) -> None:
    """Issue 21 row 7: a file moved in with an mtime 2 h older than the newest seen (``cp
    -p``, ``rsync -a``, ``mv``) was never discovered (a 600 s lookback)."""
    folder = _landing(platform)
    _write(folder / "first.jsonl", 5)
    enumerator = _continuous(platform)
    assert enumerator.discover().splits_registered == 1
    outside = tmp_path / "outside"
    outside.mkdir()
    for i, how in enumerate(("mv", "cp -p", "rsync -a")):
        made = _write(outside / f"old{i}.jsonl", 5)
        old = _identity(made).mtime_ns / 1e9 - 7200
        os.utime(made, (old, old))
        _move_in(how, made, folder / f"old{i}.jsonl")
        assert _identity(folder / f"old{i}.jsonl").mtime_ns / 1e9 == pytest.approx(old)
        tick = enumerator.discover()
        assert tick.splits_registered == 1, how
    assert len(_rows(platform)) == 4
    # The cursor stays bounded: the window holds the files changed in the last lookback.
    assert len(enumerator.cursor()["recent_paths"]) == 4


def _recreate(path: Path, n: int) -> None:
    """A new file under the same name (another inode), as a writer's rename does."""
    staged = _write(path.with_name(f".{path.name}.new"), n, start=1000)
    os.replace(staged, path)


def test_a_processed_file_re_created_is_refused_with_a_reason(
    platform: Platform, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 21: re-creation of an already processed file was ignored without a word."""
    folder = _landing(platform)
    path = _write(folder / "a.jsonl", 10)
    old = _identity(path)
    static = StaticFileEnumerator(
        platform.engine, platform.settings.source_name, platform.settings.landing_path
    )
    assert static.discover().splits_registered == 1
    _recreate(path, 30)
    with caplog.at_level(logging.WARNING):
        changed = static.discover()
    assert (changed.splits_registered, changed.changed_files) == (0, 1)
    assert f"{path} {CHANGED_REASON}" in caplog.text and "refused" in caplog.text
    first, second = _rows(platform)
    # The first version was never read: superseded; the new one quarantined with the reason.
    assert (first["status"], first["file_version"]) == ("SUPERSEDED", 0)
    assert (second["status"], second["file_version"]) == ("FAILED", 1)
    assert second["failure_reason"] == CHANGED_REASON
    assert second["last_error"].startswith(f"size {old.size} -> {_identity(path).size}")
    (listed,) = quarantined(platform.engine, platform.settings.source_name)
    assert listed.id == second["id"]
    assert static.discover().changed_files == 0  # idempotent: that version is known now
    # retry reads it as it is (the quarantined version is the current file).
    (back,) = retry_splits(platform.engine, [second["id"]])
    assert back.id == second["id"]
    assert [r["status"] for r in _rows(platform)] == ["SUPERSEDED", "UNASSIGNED"]


def test_reprocess_reads_a_changed_file_whole_as_a_new_version(platform: Platform) -> None:
    folder = _landing(platform)
    path = _write(folder / "a.jsonl", 10)
    s = platform.settings
    store = SplitStore(platform.engine)
    static = StaticFileEnumerator(
        platform.engine, s.source_name, s.landing_path, change_policy=ChangePolicy.REPROCESS
    )
    assert static.discover().splits_registered == 1
    store.assign_to_run("run-1", s.source_name, lease_seconds=60)
    done = store.pull_next("run-1", 0, 60)
    assert done is not None
    with platform.engine.begin() as conn:
        SplitStore.complete(conn, done, "run-1", done.split.end or 0, None)
    _recreate(path, 30)
    assert static.discover().changed_files == 1
    first, second = _rows(platform)
    assert (first["status"], first["file_version"]) == ("COMPLETED", 0)  # its output stays
    assert (second["status"], second["file_version"]) == ("UNASSIGNED", 1)
    assert second["end_offset"] == _identity(path).size


def test_retry_re_reads_a_quarantined_file_as_it_is_now(platform: Platform) -> None:
    """Issue 21 row 6: a quarantined CSV fixed by its owner (61 -> 200 bytes) was retried
    over its old byte range: 1 of its 4 rows reached the output."""
    folder = _landing(platform)
    path = folder / "fixed.csv"
    path.write_bytes(b"event_id,uid,event_time,event_type,amount\ne1,1,2026-01-01,click,1\n")
    s = platform.settings
    static = StaticFileEnumerator(platform.engine, s.source_name, s.landing_path)
    assert static.discover().splits_registered == 1
    (row,) = _rows(platform)
    with platform.engine.begin() as conn:  # quarantined, as the reader's failures make it
        conn.exec_driver_sql(
            "UPDATE sluice.splits SET status = 'FAILED', failures = 3,"
            " failure_reason = 'bad CSV header' WHERE id = %s",
            (row["id"],),
        )
    before = _identity(path)
    path.write_bytes(
        b"event_id,user_id,event_time,event_type,amount\n"
        + b"".join(b"e%d,1,2026-01-01T00:00:00+00:00,click,1.0\n" % i for i in range(4))
    )
    (back,) = retry_splits(platform.engine, None, source=s.source_name)
    assert back.id == row["id"]
    # Fixed in place (the same inode, larger): an append. The range read before keeps its
    # bounds (a line belongs to the range of its first byte); the new bytes are a new range.
    now = _identity(path)
    first, appended = _rows(platform)
    assert (first["status"], first["end_offset"]) == ("UNASSIGNED", before.size)
    assert (appended["status"], appended["end_offset"]) == ("UNASSIGNED", now.size)
    assert first["file_size"] == appended["file_size"] == now.size
    assert first["file_version"] == appended["file_version"] == 0
    assert static.discover().splits_registered == 0  # the current file is known


def test_retry_reads_a_replaced_quarantined_file_whole_as_a_new_version(
    platform: Platform,
) -> None:
    folder = _landing(platform)
    path = _write(folder / "a.jsonl", 10)
    s = platform.settings
    static = StaticFileEnumerator(platform.engine, s.source_name, s.landing_path)
    static.discover()
    with platform.engine.begin() as conn:
        conn.exec_driver_sql(
            "UPDATE sluice.splits SET status = 'FAILED', failure_reason = 'x' WHERE source = %s",
            (s.source_name,),
        )
    _recreate(path, 5)  # smaller, another inode
    retry_splits(platform.engine, None, source=s.source_name)
    old, new = _rows(platform)
    assert (old["status"], new["status"]) == ("SUPERSEDED", "UNASSIGNED")
    assert (new["end_offset"], new["file_version"]) == (_identity(path).size, 1)


def test_a_processed_file_appended_to_gets_only_its_new_lines_as_splits(
    platform: Platform,
) -> None:
    folder = _landing(platform)
    path = _write(folder / "a.jsonl", 10)
    size = _identity(path).size
    s = platform.settings
    for policy, status in ((ChangePolicy.REFUSE, "FAILED"), (ChangePolicy.REPROCESS, "UNASSIGNED")):
        static = StaticFileEnumerator(
            platform.engine, s.source_name, s.landing_path, change_policy=policy
        )
        static.discover()
        with path.open("ab") as file:
            file.write(b'{"n": 99}\n')
        assert static.discover().changed_files == 1
        appended = _rows(platform)[-1]
        assert (appended["status"], appended["file_version"]) == (status, 0)
        assert appended["end_offset"] == _identity(path).size
        size = _identity(path).size
    assert [r["end_offset"] for r in _rows(platform)] == [size - 20, size - 10, size]


def test_a_recent_file_re_created_is_noticed_by_the_continuous_cursor(
    platform: Platform,
) -> None:
    """A path the cursor remembers (inside the lookback window) that changes after a tick is
    compared again: nothing when only its ctime moved, a new version when it was re-created."""
    folder = _landing(platform)
    path = _write(folder / "a.jsonl", 10)
    enumerator = _continuous(platform)
    assert enumerator.discover().splits_registered == 1
    os.chmod(path, 0o640)  # the ctime moves, the file is the same
    assert (enumerator.discover().splits_registered, enumerator.discover().changed_files) == (0, 0)
    _recreate(path, 20)
    tick = enumerator.discover()
    assert (tick.splits_registered, tick.changed_files) == (0, 1)
    assert [(r["status"], r["file_version"]) for r in _rows(platform)] == [
        ("SUPERSEDED", 0),
        ("FAILED", 1),
    ]
    assert enumerator.discover().changed_files == 0
    assert str(path) in enumerator.cursor()["recent_paths"]


def test_a_rebuild_reads_only_the_current_version_of_a_changed_file(platform: Platform) -> None:
    """``--replace`` of a day re-reads the files as they are now: never an older version's
    splits (their reader would refuse them)."""
    from datetime import date

    from enumerator_service._rebuild_members import members

    folder = _landing(platform)
    path = _write(folder / "a.jsonl", 10)
    s = platform.settings
    store = SplitStore(platform.engine)
    static = StaticFileEnumerator(
        platform.engine, s.source_name, s.landing_path, change_policy=ChangePolicy.REPROCESS
    )

    def read_all(run: str) -> None:
        store.assign_to_run(run, s.source_name, lease_seconds=60)
        while (done := store.pull_next(run, 0, 60)) is not None:
            with platform.engine.begin() as conn:
                SplitStore.complete(conn, done, run, done.split.end or 0, None)

    static.discover()
    read_all("run-1")
    _recreate(path, 30)
    static.discover()
    read_all("run-2")
    old, new = _rows(platform)
    assert (old["status"], new["status"]) == ("COMPLETED", "COMPLETED")
    with platform.engine.begin() as conn:
        found, _ = members(conn, s.source_name, [date(2026, 1, 1)], "run-3", event_days=False)
    assert found == {date(2026, 1, 1): [new["id"]]}
