"""FormatRouter restore: the pending ranges of an assignment are read first, in order, as
replay blocks holding exactly their records; then the split from its resume offset; only that
last read finishes the split. For every format, single-record ranges ``[o, o + 1)`` included.
"""

from __future__ import annotations

import csv
import gzip
import io
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import orjson
import psycopg
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from source_schemas import EVENT_FIELDS, EVENTS, file_assignment

from enumerator_service import SplitAssignment, TableRangeSplit
from spark_jobs.source import OFFSET, FormatRouter

T0 = datetime(2026, 1, 1, tzinfo=UTC)
N = 12


def event(i: int) -> dict[str, Any]:
    return {
        "event_id": f"e{i}",
        "user_id": i,
        "event_time": (T0 + timedelta(seconds=i)).isoformat(),
        "event_type": "click",
        "amount": i / 2,
    }


def line_file(path: Path, kind: str) -> list[int]:
    """Writes N events (and a malformed and a blank line) in ``kind``; their offsets and the
    end of the data."""
    out = io.BytesIO()
    offsets = []
    if kind.startswith("csv"):
        out.write(b",".join(name.encode() for name in EVENT_FIELDS) + b"\r\n")
    for i in range(N):
        if i == 4:
            out.write(b"{oops\n" if kind.startswith("jsonl") else b'"oops\n')
        if i == 7:
            out.write(b"\n")
        offsets.append(out.tell())
        if kind.startswith("jsonl"):
            out.write(orjson.dumps(event(i)) + b"\n")
        else:
            text = io.StringIO()
            csv.writer(text, lineterminator="\n").writerow([str(v) for v in event(i).values()])
            out.write(text.getvalue().encode())
    data = out.getvalue()
    path.write_bytes(gzip.compress(data) if kind.endswith(".gz") else data)
    return [*offsets, len(data)]


def parquet_file(path: Path) -> list[int]:
    rows = [{**event(i), "event_time": T0 + timedelta(seconds=i)} for i in range(N)]
    pq.write_table(pa.Table.from_pylist(rows), path, row_group_size=5)
    return list(range(N + 1))


class FakeConnection:
    """Keys 100, 103, 106, ... hold event 0, 1, 2, ..."""

    def execute(self, query: str, params: tuple[int, int, int], prepare: bool) -> Any:
        low, high, limit = params
        keys = [100 + 3 * i for i in range(N)]
        rows = [(key, *event(i).values()) for i, key in enumerate(keys) if low <= key < high]
        rows = rows[:limit]

        class Cursor:
            def fetchall(self) -> list[tuple[Any, ...]]:
                return rows

        return Cursor()

    def close(self) -> None: ...


def make(kind: str, tmp: Path, pending: tuple[Any, ...], resume: int | None) -> Any:
    """(assignment, offsets of events 0..N-1 and the offset after them) of a ``kind`` split."""
    if kind == "table":
        split = TableRangeSplit("s", "public.events", "id", 100, 200)
        offsets = [100 + 3 * i for i in range(N + 1)]
        return SplitAssignment(9, split, 1, 100 if resume is None else resume, pending), offsets
    path = tmp / f"f.{kind}"
    offsets = parquet_file(path) if kind == "parquet" else line_file(path, kind)
    a = file_assignment(9, str(path), 0, None, resume, kind=kind, pending=pending)
    return a, offsets


KINDS = ["jsonl", "csv", "jsonl.gz", "csv.gz", "parquet", "table"]


def drain(router: FormatRouter, assignment: SplitAssignment) -> list[tuple[str, Any]]:
    """What the fetches return, in order: ("replay", (pending entry, event ids)),
    ("block", event ids), ("finished", split id)."""
    router.add_split(assignment)
    events: list[tuple[str, Any]] = []
    for _ in range(1000):
        if not router.has_splits():
            break
        batch = router.fetch()
        for block in batch.blocks:
            ids = block.rows.column("event_id").to_pylist()
            assert block.split_id == 9
            if block.replay:
                events.append(("replay", (block.replay_entry, ids)))
            else:
                events.append(("block", ids))
            offsets = block.rows.column(OFFSET).to_pylist()
            assert all(block.start <= o < block.end for o in offsets)
        events.extend(("finished", split_id) for split_id in batch.finished)
    router.close()
    return events


@pytest.fixture(autouse=True)
def fake_postgres(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(psycopg, "connect", lambda dsn, autocommit: FakeConnection())


def router() -> FormatRouter:
    return FormatRouter(EVENTS, max_line_bytes=1 << 10, dsn="postgresql://db", block_bytes=64)


def ids_between(offsets: list[int], start: int, end: int) -> list[str]:
    return [f"e{i}" for i, offset in enumerate(offsets) if start <= offset < end]


@pytest.mark.parametrize("kind", KINDS)
def test_pending_ranges_are_replayed_in_order_then_the_split_from_its_offset(
    kind: str, tmp_path: Path
) -> None:
    _, offsets = make(kind, tmp_path, (), None)
    o = offsets
    spans = [(o[1], o[3]), (o[6], o[6] + 1), (o[2], o[5]), (o[8], o[8])]  # the last one empty
    pending = tuple({"span": [a, b]} for a, b in spans)
    assignment, _ = make(kind, tmp_path, pending, o[9])
    events = drain(router(), assignment)
    replays = [entry_ids for what, entry_ids in events if what == "replay"]
    # Each range's blocks, in order, marked with the range's pending entry.
    grouped: dict[int, list[str]] = {}
    for entry, ids in replays:
        assert entry >= max(grouped, default=0)
        grouped.setdefault(entry, []).extend(ids)
    assert (
        grouped
        == {i: ids_between(o, a, b) for i, (a, b) in enumerate(spans[:3])}
        == {0: ["e1", "e2"], 1: ["e6"], 2: ["e2", "e3", "e4"]}
    )
    first_normal = next(i for i, (what, _) in enumerate(events) if what != "replay")
    assert all(what == "replay" for what, _ in events[:first_normal])
    normal = [i for what, ids in events[first_normal:] if what == "block" for i in ids]
    assert normal == ["e9", "e10", "e11"]
    assert events[-1] == ("finished", 9)
    assert [e for e in events if e[0] == "finished"] == [("finished", 9)]


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(kind=st.sampled_from(KINDS), data=st.data())
def test_single_record_ranges_read_exactly_that_record(
    tmp_path: Path, kind: str, data: st.DataObject
) -> None:
    _, offsets = make(kind, tmp_path, (), None)
    picks = data.draw(st.lists(st.integers(0, N - 1), min_size=1, max_size=4))
    pending = tuple({"span": [offsets[i], offsets[i] + 1]} for i in picks)
    assignment, _ = make(kind, tmp_path, pending, offsets[N])
    events = drain(router(), assignment)
    replayed = [entry_ids for what, entry_ids in events if what == "replay" and entry_ids[1]]
    assert replayed == [(entry, [f"e{i}"]) for entry, i in enumerate(picks)]
    assert [what for what, _ in events if what != "replay"][-1:] == ["finished"]
    assert [i for what, ids in events if what == "block" for i in ids] == []


def test_dead_letters_of_a_replayed_range_come_back_marked_replay(tmp_path: Path) -> None:
    _, offsets = make("jsonl", tmp_path, (), None)
    assignment, _ = make("jsonl", tmp_path, ({"span": [offsets[3], offsets[5]]},), offsets[-1])
    r = router()
    r.add_split(assignment)
    blocks = []
    while r.has_splits():
        blocks.extend(r.fetch().blocks)
    replays = [b for b in blocks if b.replay]
    assert [reason[:12] for b in replays for _, _, reason in b.dead] == ["invalid JSON"]
    assert [i for b in replays for i in b.rows.column("event_id").to_pylist()] == ["e3", "e4"]


@pytest.mark.parametrize(
    "entry", [["e1", 1, "2026-01-01", "x", 1.0], {"span": [1]}, {"other": [0, 1]}, "span"]
)
def test_an_unreadable_pending_entry_fails_the_split(tmp_path: Path, entry: Any) -> None:
    assignment, _ = make("jsonl", tmp_path, (entry,), None)
    with pytest.raises(ValueError, match="unreadable pending entry"):
        router().add_split(assignment)


def test_unknown_kinds_fail_when_added() -> None:
    with pytest.raises(ValueError, match="no split reader for kind 'xml'"):
        router().add_split(file_assignment(1, "/f.xml", 0, None, kind="xml"))
