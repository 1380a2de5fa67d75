"""Poison splits on the reader side: a split whose content fails (truncated gzip, corrupt
Parquet footer, bad CSV header, a file gone) is dropped and reported with its reason while the
reader goes on with its other splits; infrastructure errors still fail the task; a failed
split's snapshot carries the failure only once the chain holds none of its records.

Real files, a real fetcher thread and hand-off queue; no Postgres (see
``tests/integration/test_poison_splits.py`` for the commit side and a continuous run).
"""

from __future__ import annotations

import gzip
from pathlib import Path

import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import sqlalchemy as sa
from source_schemas import EVENTS, file_assignment
from test_source_reader import T0, Collect

from enumerator_service import SplitAssignment, SplitState
from spark_jobs.connectors import source_connector_for_split
from spark_jobs.connectors.files import FilesConnector
from spark_jobs.jobs._stages import PendingRange
from spark_jobs.jobs._task_state import TaskSplit, snapshot_splits
from spark_jobs.source import (
    FormatRouter,
    HandoffQueue,
    InputStatus,
    RecordEmitter,
    SourceReaderBase,
    SplitFetcher,
)
from spark_jobs.source._poison import MAX_ERROR_CHARS, SplitFailure, content_failure, one_line


class CollectFailures(Collect):
    def __init__(self) -> None:
        super().__init__()
        self.failed: list[tuple[SplitFailure, int]] = []

    def split_failed(self, failure: SplitFailure, state: SplitState) -> None:
        self.failed.append((failure, state.offset))


def events(prefix: str, n: int) -> list[dict[str, object]]:
    return [
        {
            "event_id": f"{prefix}-{i}",
            "user_id": i,
            "event_time": T0.isoformat(),
            "event_type": "view",
            "amount": 1.0,
        }
        for i in range(n)
    ]


def jsonl(rows: list[dict[str, object]]) -> bytes:
    return b"".join(orjson.dumps(r) + b"\n" for r in rows)


def write_poison(folder: Path) -> dict[str, tuple[str, str]]:
    """The three poison files of issue 13: name → (kind, path)."""
    whole = gzip.compress(jsonl(events("gz", 2000)))
    (folder / "truncated.jsonl.gz").write_bytes(whole[: len(whole) // 2])
    table = pa.Table.from_pylist(events("pq", 10))
    pq.write_table(table, folder / "corrupt.parquet")
    data = (folder / "corrupt.parquet").read_bytes()
    (folder / "corrupt.parquet").write_bytes(data[:-8] + b"XXXXXXXX")  # footer length + magic
    (folder / "bad_header.csv").write_bytes(b"id,user,time\n1,2,3\n")
    return {
        "gz": ("jsonl.gz", str(folder / "truncated.jsonl.gz")),
        "parquet": ("parquet", str(folder / "corrupt.parquet")),
        "csv": ("csv", str(folder / "bad_header.csv")),
    }


def read_all(assignments: list[SplitAssignment]) -> CollectFailures:
    router = FormatRouter(EVENTS, max_line_bytes=1 << 12, dsn="unused", block_bytes=4096)
    handoff = HandoffQueue(capacity=2)
    queue = list(assignments)
    fetcher = SplitFetcher(router, handoff, lambda: [queue.pop(0)] if queue else [], [])
    reader = SourceReaderBase(fetcher, handoff, RecordEmitter())
    out = CollectFailures()
    reader.start()
    try:
        while (status := reader.poll_next(out)) is not InputStatus.END_OF_INPUT:
            if status is InputStatus.NOTHING_AVAILABLE:
                reader.is_available().result(timeout=30)
    finally:
        reader.close()
    return out


def test_poison_files_are_dropped_with_their_reason_and_the_reader_goes_on(
    tmp_path: Path,
) -> None:
    poison = write_poison(tmp_path)
    (tmp_path / "a.jsonl").write_bytes(jsonl(events("a", 50)))
    (tmp_path / "b.jsonl").write_bytes(jsonl(events("b", 50)))
    out = read_all(
        [
            file_assignment(1, str(tmp_path / "a.jsonl"), 0, None),
            file_assignment(2, poison["gz"][1], 0, None, kind="jsonl.gz"),
            file_assignment(3, poison["parquet"][1], 0, 1, kind="parquet"),
            file_assignment(4, poison["csv"][1], 0, None, kind="csv"),
            file_assignment(5, str(tmp_path / "b.jsonl"), 0, None),
        ]
    )
    ids = out.ids()
    good = [i for i in ids if not i.startswith("gz-")]
    assert good == [f"a-{i}" for i in range(50)] + [f"b-{i}" for i in range(50)]
    # The truncated gzip's records before the damage were read (they commit with the
    # failure; the next attempt resumes after them), each once, in order.
    partial = [i for i in ids if i.startswith("gz-")]
    assert 0 < len(partial) < 2000
    assert partial == [f"gz-{i}" for i in range(len(partial))]
    assert [s for s, *_ in out.finished] == [1, 5]
    failed = {f.split_id: (f.reason, f.error, offset) for f, offset in out.failed}
    assert sorted(failed) == [2, 3, 4]
    assert failed[2][0] == "truncated compressed stream"
    assert failed[2][2] == len(jsonl(events("gz", len(partial))))  # offset reached
    assert failed[3][:1] == ("unreadable Parquet file",)
    assert "magic bytes" in failed[3][1] or "footer" in failed[3][1].lower()
    assert failed[3][2] == 0
    assert failed[4][0] == "bad CSV header"
    assert "header lacks required columns" in failed[4][1]
    for _reason, error, _ in failed.values():
        assert "\n" not in error and len(error) <= MAX_ERROR_CHARS


def test_a_file_gone_after_discovery_fails_its_split_only(tmp_path: Path) -> None:
    (tmp_path / "a.jsonl").write_bytes(jsonl(events("a", 3)))
    out = read_all(
        [
            file_assignment(1, str(tmp_path / "gone.jsonl"), 0, None),
            file_assignment(2, str(tmp_path / "a.jsonl"), 0, None),
        ]
    )
    assert out.ids() == ["a-0", "a-1", "a-2"]
    assert [(f.split_id, f.reason) for f, _ in out.failed] == [(1, "file not found")]


class Flaky:
    """A split reader whose fetch raises an infrastructure error."""

    def __init__(self, exc: Exception) -> None:
        self.exc = exc

    def add_split(self, assignment: SplitAssignment) -> None: ...
    def has_splits(self) -> bool:
        return True

    def fetch(self) -> object:
        raise self.exc

    def wake_up(self) -> None: ...
    def close(self) -> None: ...


@pytest.mark.parametrize(
    ("kind", "exc"),
    [
        ("jsonl", sa.exc.OperationalError("select", {}, Exception("server closed"))),
        ("jsonl", MemoryError()),
        ("jsonl", TypeError("a bug")),
        ("jsonl", ConnectionResetError("peer")),
        ("table", ValueError("bad key from the database")),
    ],
)
def test_infrastructure_errors_are_not_the_splits_fault(kind: str, exc: Exception) -> None:
    errors = source_connector_for_split(kind).content_errors()
    assert content_failure(1, errors, exc) is None


def test_an_infrastructure_error_still_fails_the_task(tmp_path: Path) -> None:
    router = FormatRouter(EVENTS, max_line_bytes=1 << 12, dsn="unused")
    (tmp_path / "a.jsonl").write_bytes(jsonl(events("a", 3)))
    router.add_split(file_assignment(1, str(tmp_path / "a.jsonl"), 0, None))

    class Broken:
        def open(self, read: object) -> None:
            raise ConnectionResetError("storage went away")

        def close(self) -> None: ...

    _connector, files = router._reader_for("jsonl")
    files._lines = Broken()  # type: ignore[attr-defined]
    with pytest.raises(ConnectionResetError):
        router.fetch()


def test_error_messages_are_one_bounded_line_without_passwords() -> None:
    text = "line one\nline two postgresql://u:s3cret@db/x " + "x" * 2000
    failure = content_failure(9, FilesConnector().content_errors(), ValueError(text))
    assert failure is not None
    assert "\n" not in failure.error and "s3cret" not in failure.error
    assert len(failure.error) <= MAX_ERROR_CHARS and failure.error.endswith("…")
    assert one_line("a\r\n  b") == "a b"


def held(split_id: int, offset: int, failure: SplitFailure | None) -> TaskSplit:
    assignment = file_assignment(split_id, "/x", 0, None)
    state = assignment.initial_state()
    state.offset = offset
    return TaskSplit(assignment, state, reading_done=True, failure=failure)


def test_a_failed_split_is_snapshotted_as_failed_once_the_chain_holds_none_of_it() -> None:
    failure = SplitFailure(1, "truncated compressed stream", "EOFError: ended")
    splits = {1: held(1, 120, failure), 2: held(2, 50, None)}
    in_chain = [PendingRange(1, 100, 120, None)]
    first = snapshot_splits(splits, in_chain, 7, max_attempts=4)
    assert first[0]["finished"] is False and "failed" not in first[0]
    assert first[0]["pending"] == [{"span": [100, 120]}]
    assert splits[1].finished_in is None
    second = snapshot_splits(splits, [], 8, max_attempts=4)
    assert second[0]["finished"] is True and second[0]["pending"] == []
    assert second[0]["failed"] == {
        "reason": "truncated compressed stream",
        "error": "EOFError: ended",
        "max_attempts": 4,
    }
    assert second[0]["offset"] == 120
    assert splits[1].finished_in == 8
    assert "failed" not in second[1]


@pytest.mark.parametrize(
    ("name", "kind", "content", "reason"),
    [
        ("not_gzip.jsonl.gz", "jsonl.gz", b"plain text, not gzip\n", "corrupt gzip stream"),
        (
            "empty.jsonl.gz",
            "jsonl.gz",
            gzip.compress(b"", mtime=0)[:5],
            "truncated compressed stream",
        ),
        ("empty.parquet", "parquet", b"", "unreadable Parquet file"),
        ("text.parquet", "parquet", b"PAR1 not really\n", "unreadable Parquet file"),
        ("latin1.csv", "csv", b"event_id,\xe9v\xe9nement\n1,2\n", "bad CSV header"),
        ("dupes.csv", "csv", b"event_id,event_id\n1,2\n", "bad CSV header"),
        ("long.csv", "csv", b"x" * 5000 + b"\n1\n", "bad CSV header"),
        ("header.csv.gz", "csv.gz", gzip.compress(b"a,b\n1,2\n", mtime=0), "bad CSV header"),
    ],
)
def test_more_poison_shapes_are_each_their_splits_failure(
    tmp_path: Path, name: str, kind: str, content: bytes, reason: str
) -> None:
    (tmp_path / name).write_bytes(content)
    (tmp_path / "a.jsonl").write_bytes(jsonl(events("a", 2)))
    end = 1 if kind == "parquet" else None
    out = read_all(
        [
            file_assignment(1, str(tmp_path / name), 0, end, kind=kind),
            file_assignment(2, str(tmp_path / "a.jsonl"), 0, None),
        ]
    )
    assert out.ids() == ["a-0", "a-1"]
    assert [(f.split_id, f.reason) for f, _ in out.failed] == [(1, reason)]
