"""A sink whose write failed can never pre-commit (issue 21, row 3): the Parquet writer's
failure paths with faults injected into its background writes — ENOSPC from a write, from
``close()``, and a ``close()`` that succeeds after ENOSPC and leaves a file without its footer
(what pyarrow does) or short of rows. A real writer thread, no database."""

from __future__ import annotations

import errno
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, ClassVar

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from spark_jobs.sink import ParquetSinkWriter, StagedFileError
from spark_jobs.sink import _parquet as parquet_module

SCHEMA = pa.schema([pa.field("id", pa.int64()), pa.field("name", pa.string())])
#: Rows per write_batch: one hand-over to the writer thread each (the sink's chunk size).
CHUNK = parquet_module._BATCH_CHUNK


def _batch(start: int, rows: int = CHUNK) -> pa.RecordBatch:
    ids = list(range(start, start + rows))
    return pa.RecordBatch.from_pydict({"id": ids, "name": [f"n{i}" for i in ids]}, schema=SCHEMA)


class FaultyWriter(pq.ParquetWriter):  # type: ignore[misc]
    """A real ParquetWriter with one fault: ``fail_write`` (the n-th write_table raises
    ENOSPC), ``fail_close`` (close raises ENOSPC after closing), ``truncate`` (close succeeds,
    the file loses its tail), ``lose_rows`` (a write_table silently writes half the rows)."""

    fault: ClassVar[dict[str, Any]] = {}

    def __init__(self, where: Path, *args: Any, **kw: Any) -> None:
        super().__init__(where, *args, **kw)
        self.where = Path(where)
        self.writes = 0
        # Each writer keeps the fault of the test that opened it: a writer an earlier test left
        # open is closed by the garbage collector later, when the class holds another fault.
        self.fault = dict(type(self).fault)

    def write_table(self, table: pa.Table, *args: Any, **kw: Any) -> None:
        self.writes += 1
        if self.fault.get("fail_write") == self.writes:
            raise OSError(errno.ENOSPC, "No space left on device")
        if self.fault.get("lose_rows"):
            table = table.slice(0, table.num_rows // 2)
        super().write_table(table, *args, **kw)

    def close(self) -> None:
        super().close()
        if self.fault.get("fail_close"):
            raise OSError(errno.ENOSPC, "No space left on device")
        if self.fault.get("truncate"):
            size = self.where.stat().st_size
            with self.where.open("r+b") as f:
                f.truncate(size // 2)


@pytest.fixture
def io() -> Iterator[ThreadPoolExecutor]:
    pool = ThreadPoolExecutor(1, thread_name_prefix="sink-writer")
    yield pool
    pool.shutdown()


def _writer(
    io: ThreadPoolExecutor, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, **fault: Any
) -> ParquetSinkWriter:
    monkeypatch.setattr(FaultyWriter, "fault", fault)
    monkeypatch.setattr(parquet_module.pq, "ParquetWriter", FaultyWriter)
    return ParquetSinkWriter(
        io,
        schema=SCHEMA,
        dictionary=[],
        compression="zstd",
        staging_root=tmp_path / "staging",
        output_root=tmp_path / "out",
        run_id="r1",
        subtask=0,
        attempt="a1",
    )


def _staged_files(tmp_path: Path) -> list[Path]:
    return sorted((tmp_path / "staging").rglob("*.parquet"))


def test_a_failed_background_write_fails_the_pre_commit_and_nothing_is_staged(
    io: ThreadPoolExecutor, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    writer = _writer(io, tmp_path, monkeypatch, fail_write=2)
    writer.write_batch("dt=2026-01-01", _batch(0))
    writer.write_batch("dt=2026-01-01", _batch(CHUNK))  # this hand-over fails
    with pytest.raises(StagedFileError, match="No space left") as failed:
        writer.pre_commit().result(timeout=30)
    assert isinstance(failed.value.__cause__, OSError)
    assert failed.value.__cause__.errno == errno.ENOSPC
    # The error stays: a later pre-commit of the same attempt cannot acknowledge either.
    with pytest.raises(StagedFileError):
        writer.pre_commit().result(timeout=30)
    io.submit(writer.abort).result(timeout=30)
    assert _staged_files(tmp_path) == []


def test_a_failed_write_fails_the_next_hand_over_on_the_mailbox_thread(
    io: ThreadPoolExecutor, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    writer = _writer(io, tmp_path, monkeypatch, fail_write=1)
    writer.write_batch("", _batch(0))
    io.submit(lambda: None).result(timeout=30)  # the failed write has run
    with pytest.raises(OSError, match="No space left"):
        writer.write_batch("", _batch(CHUNK))  # the task fails now, not at the checkpoint
    io.submit(writer.abort).result(timeout=30)


def test_enospc_from_close_fails_the_pre_commit(
    io: ThreadPoolExecutor, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    writer = _writer(io, tmp_path, monkeypatch, fail_close=True)
    writer.write_batch("", _batch(0, 10))
    with pytest.raises(OSError, match="No space left"):
        writer.pre_commit().result(timeout=30)
    io.submit(writer.abort).result(timeout=30)  # closing again fails again: still removed
    assert _staged_files(tmp_path) == []


def test_a_file_without_its_footer_after_a_successful_close_is_never_staged(
    io: ThreadPoolExecutor, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    writer = _writer(io, tmp_path, monkeypatch, truncate=True)
    writer.write_batch("", _batch(0))
    with pytest.raises(StagedFileError, match="unreadable"):
        writer.pre_commit().result(timeout=30)


def test_a_file_short_of_its_rows_is_never_staged(
    io: ThreadPoolExecutor, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    writer = _writer(io, tmp_path, monkeypatch, lose_rows=True)
    writer.write_batch("", _batch(0, 100))
    with pytest.raises(StagedFileError, match=r"holds 50 rows, 100 written"):
        writer.pre_commit().result(timeout=30)


def test_verified_files_are_staged_with_their_rows(
    io: ThreadPoolExecutor, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    writer = _writer(io, tmp_path, monkeypatch)
    writer.write_batch("dt=2026-01-01", _batch(0))
    writer.write_batch("dt=2026-01-01", _batch(CHUNK, 5))
    writer.write_batch("dt=2026-01-02", _batch(0, 7))
    out = writer.pre_commit().result(timeout=30)
    assert [entry["rows"] for entry in out.files] == [CHUNK + 5, 7]
    assert [pq.read_metadata(entry["staged"]).num_rows for entry in out.files] == [CHUNK + 5, 7]
