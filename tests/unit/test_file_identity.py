"""A landing file's identity and the reader's refusal of a file that changed since discovery
(issue 21, "files are immutable or detected"), and a UTF-8 byte order mark opening a JSON
Lines file. Real files under tmp_path; no database, no sleeps."""

from __future__ import annotations

import os
import shutil
from datetime import date
from pathlib import Path

import pyarrow as pa
import pytest

from enumerator_service import FileChangedError, FileIdentity, FileSplit, SplitAssignment
from enumerator_service._file_identity import CHANGED_REASON, check_unchanged, current
from spark_jobs.connectors.files import FilesConnector
from spark_jobs.source._batch import RecordSchema
from spark_jobs.source._format_router import FormatRouter
from spark_jobs.source._poison import content_failure

FILES_ERRORS = FilesConnector().content_errors()

NUMBERED = RecordSchema((pa.field("n", pa.int64()),), frozenset({"n"}))


def _write(path: Path, numbers: range, *, tail: bytes = b"") -> Path:
    path.write_bytes(b"".join(b'{"n": %d}\n' % n for n in numbers) + tail)
    return path


def _identity(path: Path) -> FileIdentity:
    found = current(str(path))
    assert found is not None
    return found


def test_identity_is_size_mtime_and_inode_not_ctime(tmp_path: Path) -> None:
    path = _write(tmp_path / "a.jsonl", range(10))
    before = _identity(path)
    os.chmod(path, 0o600)  # moves the ctime only: the same content, the same version
    after_chmod = _identity(path)
    assert after_chmod.ctime_ns >= before.ctime_ns and after_chmod.same_as(before)
    with path.open("ab") as file:  # appended: another size (and mtime)
        file.write(b'{"n": 10}\n')
    grown = _identity(path)
    assert not grown.same_as(before)
    assert grown.difference(before).startswith(f"size {before.size} -> {grown.size}")
    # Replaced by a rename: same size and mtime, another inode.
    twin = tmp_path / ".twin"
    shutil.copy2(path, twin)
    os.replace(twin, path)
    replaced = _identity(path)
    assert (replaced.size, replaced.mtime_ns) == (grown.size, grown.mtime_ns)
    assert not replaced.same_as(grown) and replaced.difference(grown) == "replaced (another inode)"
    # An identity recorded without an inode compares size and mtime only.
    assert replaced.same_as(FileIdentity(grown.size, grown.mtime_ns, None))


def test_change_time_is_when_the_file_appeared_whatever_its_mtime(tmp_path: Path) -> None:
    """``mv``/``cp -p``/``rsync -a`` keep an old mtime; the ctime says when it appeared."""
    outside = _write(tmp_path / "elsewhere.jsonl", range(3))
    old = _identity(outside).ctime_ns / 1e9 - 7200
    os.utime(outside, (old, old))
    moved = tmp_path / "landed.jsonl"
    os.rename(outside, moved)
    identity = _identity(moved)
    assert identity.mtime_ns / 1e9 == pytest.approx(old)
    assert identity.changed_at >= old + 7200 - 1  # the ctime: the move, not the mtime


def test_check_unchanged(tmp_path: Path) -> None:
    path = _write(tmp_path / "a.jsonl", range(5))
    recorded = _identity(path)
    check_unchanged(str(path), recorded)  # the same file
    check_unchanged(str(path), None)  # registered before identities were kept: never refused
    _write(path, range(8))
    with pytest.raises(FileChangedError, match=f"{CHANGED_REASON}: size {recorded.size} -> "):
        check_unchanged(str(path), recorded)
    path.unlink()
    check_unchanged(str(path), recorded)  # gone: the reader's open says "file not found"


def test_a_changed_file_is_a_final_content_failure() -> None:
    failure = content_failure(7, FILES_ERRORS, FileChangedError("x changed since discovery: size"))
    assert failure is not None
    assert (failure.split_id, failure.reason, failure.final) == (7, CHANGED_REASON, True)
    gone = content_failure(7, FILES_ERRORS, FileNotFoundError("x"))
    assert gone is not None and not gone.final  # may come back: counted attempts as before


def _read(router: FormatRouter, split: FileSplit) -> tuple[list[int], list[str], list[str]]:
    """(numbers read, dead-letter reasons, failure reasons) of one split."""
    router.add_split(SplitAssignment(1, split, 0, 0))
    numbers: list[int] = []
    dead: list[str] = []
    failed: list[str] = []
    while router.has_splits():
        batch = router.fetch()
        for block in batch.blocks:
            numbers.extend(block.rows.column("n").to_pylist())
            dead.extend(reason for _, _, reason in block.dead)
        failed.extend(f"{f.reason}: {f.error}" for f in batch.failed)
    return numbers, dead, failed


@pytest.fixture
def router() -> FormatRouter:
    return FormatRouter(NUMBERED, max_line_bytes=1 << 20, dsn="unused", block_bytes=64)


def test_the_reader_refuses_a_file_replaced_since_discovery(
    tmp_path: Path, router: FormatRouter
) -> None:
    """Issue 21 row 5: 500 events replaced by 800 between discover and run were read as a
    mix cut at the old size (492 of 800); now the split is refused, nothing is read."""
    path = _write(tmp_path / "a.jsonl", range(500))
    identity = _identity(path)
    split = FileSplit("s", "jsonl", str(path), 0, identity.size, date(2026, 1, 1), identity)
    staged = _write(tmp_path / ".a.jsonl.tmp", range(1000, 1800))
    os.replace(staged, path)
    numbers, dead, failed = _read(router, split)
    assert (numbers, dead) == ([], [])
    (reason,) = failed
    assert reason.startswith(f"{CHANGED_REASON}: FileChangedError: {path} {CHANGED_REASON}")
    assert f"size {identity.size} -> {_identity(path).size}" in reason


def test_the_reader_reads_an_unchanged_file_and_one_without_identity(
    tmp_path: Path, router: FormatRouter
) -> None:
    path = _write(tmp_path / "a.jsonl", range(50))
    identity = _identity(path)
    split = FileSplit("s", "jsonl", str(path), 0, identity.size, date(2026, 1, 1), identity)
    assert _read(router, split) == (list(range(50)), [], [])
    legacy = FileSplit("s", "jsonl", str(path), 0, identity.size, date(2026, 1, 1))
    assert _read(router, legacy) == (list(range(50)), [], [])


@pytest.mark.parametrize("gz", [False, True])
def test_a_byte_order_mark_opening_a_json_lines_file_is_not_part_of_its_first_record(
    tmp_path: Path, router: FormatRouter, gz: bool
) -> None:
    """Issue 21: a UTF-8 BOM dead-lettered the first record as "invalid UTF-8"."""
    import gzip

    data = b"\xef\xbb\xbf" + b"".join(b'{"n": %d}\n' % n for n in range(20))
    path = tmp_path / ("bom.jsonl.gz" if gz else "bom.jsonl")
    path.write_bytes(gzip.compress(data) if gz else data)
    split = FileSplit(
        "s", "jsonl.gz" if gz else "jsonl", str(path), 0, None if gz else len(data), None
    )
    assert _read(router, split) == (list(range(20)), [], [])
    # A BOM anywhere else is content: that line stays a dead letter.
    inner = tmp_path / "inner.jsonl"
    inner.write_bytes(b'{"n": 1}\n\xef\xbb\xbf{"n": 2}\n')
    numbers, dead, _ = _read(router, FileSplit("s", "jsonl", str(inner), 0, 20, None))
    assert numbers == [1] and len(dead) == 1
