"""SourceReaderBase and RecordEmitter on the mailbox side: per-split state and watermarks,
idleness, dead letters, replay blocks, end of input; and one run with a real fetcher thread.

Fetch results are put on the hand-off queue by the test (no fetcher thread) except in the last
test; time is a fake clock.
"""

from __future__ import annotations

import dataclasses
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa
import pytest
from source_schemas import EVENTS, ORDERS, file_assignment

from enumerator_service import SplitAssignment, SplitState
from spark_jobs.source import (
    OFFSET,
    FormatRouter,
    HandoffQueue,
    InputStatus,
    ParsedBlock,
    RecordConverter,
    RecordEmitter,
    RecordSchema,
    RecordsWithSplitIds,
    SourceReaderBase,
    SplitFetcher,
)
from spark_jobs.source._convert import new_block

T0 = datetime(2026, 1, 1, tzinfo=UTC)


class NoFetcher:
    def start(self) -> None: ...
    def shutdown(self) -> None: ...


class Collect:
    def __init__(self) -> None:
        self.added: list[tuple[int, int]] = []
        self.blocks: list[ParsedBlock] = []
        self.dead: list[tuple[int, int, bytes, str]] = []
        self.dead_days: list[date | None] = []
        self.finished: list[tuple[int, int, int, int]] = []

    def split_added(self, assignment: SplitAssignment, state: SplitState) -> None:
        self.added.append((assignment.split_id, state.offset))

    def collect_block(self, block: ParsedBlock) -> None:
        self.blocks.append(block)

    def dead_letter(
        self, split_id: int, offset: int, raw: bytes, reason: str, day: date | None = None
    ) -> None:
        self.dead.append((split_id, offset, raw, reason))
        self.dead_days.append(day)

    def split_finished(self, split_id: int, state: SplitState) -> None:
        self.finished.append((split_id, state.offset, state.records, state.dead_letters))

    def ids(self) -> list[str]:
        return [i for block in self.blocks for i in block.rows.column("event_id").to_pylist()]


def block(
    split_id: int,
    start: int,
    seconds: list[int],
    dead: list[tuple[int, bytes, str]] | None = None,
    *,
    replay: bool = False,
    schema: RecordSchema = EVENTS,
) -> ParsedBlock:
    """Events ``e<split>-<s>`` at T0 + s seconds, at offsets start, start + 10, ..."""
    converter = RecordConverter(schema)
    rows = [
        converter.from_json(
            {
                "event_id": f"e{split_id}-{s}",
                "user_id": 1,
                "event_time": (T0 + timedelta(seconds=s)).isoformat(),
                "event_type": "click",
                "amount": 0,
            }
        )
        for s in seconds
    ]
    offsets = [start + 10 * i for i in range(len(seconds))]
    batch = converter.to_batch(rows, offsets)  # type: ignore[arg-type]
    end = start + 10 * len(seconds) + 10 * len(dead or [])
    parsed = new_block(schema, split_id, start, end, batch, list(dead or []))
    parsed.replay = replay
    return parsed


def harness(now: list[float]) -> tuple[SourceReaderBase, HandoffQueue]:
    handoff = HandoffQueue(capacity=16)
    emitter = RecordEmitter(
        out_of_orderness=timedelta(seconds=5), idle_timeout=30.0, clock=lambda: now[0]
    )
    reader = SourceReaderBase(NoFetcher(), handoff, emitter)  # type: ignore[arg-type]
    return reader, handoff


def assignment(split_id: int, resume: int = 0, path: str = "/f") -> SplitAssignment:
    return file_assignment(split_id, f"{path}{split_id}", 0, None, resume)


def drain(reader: SourceReaderBase, out: Any) -> InputStatus:
    while (status := reader.poll_next(out)) is InputStatus.MORE_AVAILABLE:
        pass
    return status


def test_task_watermark_is_the_minimum_over_active_splits_and_idle_ones_drop_out() -> None:
    now = [0.0]
    reader, handoff = harness(now)
    out = Collect()
    a, b = assignment(1), assignment(2)
    handoff.put(RecordsWithSplitIds(added=[a, b], blocks=[block(1, 0, [100])]))
    handoff.put(RecordsWithSplitIds(blocks=[block(2, 0, [40])]))
    assert drain(reader, out) is InputStatus.NOTHING_AVAILABLE
    # Each split's watermark is its max event time minus the bounded out-of-orderness.
    assert reader.split_states[1].watermark == T0 + timedelta(seconds=95)
    assert reader.watermark() == T0 + timedelta(seconds=35)  # split 2 holds it back

    now[0] = 20.0
    handoff.put(RecordsWithSplitIds(blocks=[block(1, 10, [160, 150])]))
    drain(reader, out)
    now[0] = 45.0  # split 2 silent for 45 s > 30 s: idle; split 1 active (last record at 20)
    assert reader.idle_splits() == [2]
    assert reader.watermark() == T0 + timedelta(seconds=155)

    handoff.put(RecordsWithSplitIds(blocks=[block(2, 10, [50])]))
    drain(reader, out)  # a record makes split 2 active again
    assert reader.idle_splits() == []
    assert reader.watermark() == T0 + timedelta(seconds=45)
    assert out.ids() == ["e1-100", "e2-40", "e1-160", "e1-150", "e2-50"]
    assert out.added == [(1, 0), (2, 0)]


def test_a_split_without_a_watermark_holds_the_task_back_until_it_is_idle() -> None:
    now = [0.0]
    reader, handoff = harness(now)
    out = Collect()
    handoff.put(RecordsWithSplitIds(added=[assignment(1), assignment(2)]))
    handoff.put(RecordsWithSplitIds(blocks=[block(1, 0, [100])]))
    drain(reader, out)
    assert reader.watermark() is None  # split 2 was just added: it may still bring old records
    assert not reader.is_idle()
    now[0] = 31.0  # no record from split 2 for 31 s > 30 s (counted from when it was added)
    handoff.put(RecordsWithSplitIds(blocks=[block(1, 10, [110])]))
    drain(reader, out)
    assert reader.idle_splits() == [2]
    assert reader.watermark() == T0 + timedelta(seconds=105)
    assert not reader.is_idle()  # split 1 is active
    now[0] = 62.0
    assert reader.idle_splits() == [1, 2] and reader.is_idle()
    assert reader.watermark() is None  # no active split: nothing to say


def test_a_restored_split_resumes_its_committed_watermark_and_never_regresses() -> None:
    now = [0.0]
    reader, handoff = harness(now)
    out = Collect()
    committed = T0 + timedelta(seconds=95)
    restored = dataclasses.replace(assignment(4, resume=100), committed_watermark=committed)
    assert restored.initial_state().watermark == committed
    handoff.put(RecordsWithSplitIds(added=[restored]))
    drain(reader, out)
    assert reader.split_states[4].watermark == committed
    assert reader.watermark() == committed  # active (just added) with its restored watermark
    # Records older than the committed progress (out of order in the file) move nothing back.
    handoff.put(RecordsWithSplitIds(blocks=[block(4, 100, [60, 70])]))
    drain(reader, out)
    assert reader.split_states[4].watermark == committed
    handoff.put(RecordsWithSplitIds(blocks=[block(4, 120, [130])]))
    drain(reader, out)
    assert reader.split_states[4].watermark == T0 + timedelta(seconds=125)


def test_split_state_follows_emitted_blocks_dead_letters_included() -> None:
    now = [0.0]
    reader, handoff = harness(now)
    out = Collect()
    dead = [(20, b"{not json", "invalid JSON: x")]
    handoff.put(
        RecordsWithSplitIds(added=[assignment(7)], blocks=[block(7, 0, [1, 2], dead)], finished=[7])
    )
    handoff.put(RecordsWithSplitIds(end_of_input=True))
    assert reader.poll_next(out) is InputStatus.MORE_AVAILABLE  # one block per call
    assert reader.split_states[7].offset == 30 and len(out.blocks) == 1
    assert drain(reader, out) is InputStatus.END_OF_INPUT
    assert out.dead == [(7, 20, b"{not json", "invalid JSON: x")]
    assert out.dead_days == [None]  # the reader gave it no day
    assert out.finished == [(7, 30, 2, 1)]  # the offset after the last record, dead letter too
    assert reader.split_states == {}
    assert reader.is_idle()  # no split held


def test_the_day_a_reader_gives_each_dead_letter_reaches_the_output() -> None:
    reader, handoff = harness([0.0])
    out = Collect()
    parsed = block(7, 0, [1], [(20, b"x", "invalid JSON: x"), (25, b"y", "invalid UTF-8: y")])
    parsed.dead_days = [date(2026, 5, 2), None]
    handoff.put(RecordsWithSplitIds(added=[assignment(7)], blocks=[parsed], finished=[7]))
    handoff.put(RecordsWithSplitIds(end_of_input=True))
    assert drain(reader, out) is InputStatus.END_OF_INPUT
    assert [offset for _, offset, _, _ in out.dead] == [20, 25]
    assert out.dead_days == [date(2026, 5, 2), None]


def _rowless_block_31_s_later(
    rowless: ParsedBlock,
) -> tuple[SourceReaderBase, Collect, list[float]]:
    """Split 3 emitted a record (time 9 s) at clock 0; at clock 31 s, past the 30 s idle
    timeout, ``rowless`` (a block of split 3 without rows) arrives."""
    now = [0.0]
    reader, handoff = harness(now)
    out = Collect()
    handoff.put(RecordsWithSplitIds(added=[assignment(3)], blocks=[block(3, 0, [9])]))
    drain(reader, out)
    now[0] = 31.0
    handoff.put(RecordsWithSplitIds(blocks=[rowless]))
    drain(reader, out)
    return reader, out, now


def test_a_block_without_rows_moves_the_offset_but_not_the_watermark_or_activity() -> None:
    reader, out, _ = _rowless_block_31_s_later(block(3, 10, [], [(10, b"", "x: y")]))
    state = reader.split_states[3]
    assert (state.offset, state.records, state.dead_letters) == (20, 1, 1)
    assert state.watermark == T0 + timedelta(seconds=4)
    assert reader.idle_splits() == [3]  # no record since time 0
    assert len(out.blocks) == 2


def test_a_heartbeat_block_raises_the_watermark_and_keeps_the_split_active() -> None:
    """A block without rows that carries an event time (a CDC reader's marker: every record
    still to come is of that time or later) is progress, not silence."""
    beat = block(3, 10, [])
    beat.max_event_time = T0 + timedelta(seconds=40)
    reader, _, now = _rowless_block_31_s_later(beat)
    state = reader.split_states[3]
    assert (state.offset, state.records) == (10, 1)
    assert state.watermark == T0 + timedelta(seconds=35)  # minus out_of_orderness
    assert reader.idle_splits() == [] and reader.watermark() == T0 + timedelta(seconds=35)
    now[0] = 62.0  # 31 s without a record or a heartbeat: idle again
    assert reader.idle_splits() == [3]


def test_replay_blocks_only_re_enter_the_chain() -> None:
    now = [0.0]
    reader, handoff = harness(now)
    out = Collect()
    restored = assignment(5, resume=500)
    replayed = block(5, 100, [300], [(110, b"bad", "invalid JSON: x")], replay=True)
    handoff.put(
        RecordsWithSplitIds(added=[restored], blocks=[replayed, block(5, 500, [10])], finished=[5])
    )
    drain(reader, out)
    assert out.added == [(5, 500)]
    assert [b.replay for b in out.blocks] == [True, False]
    assert out.dead == []  # recorded before the restored checkpoint
    assert out.finished == [(5, 510, 1, 0)]  # the replay block moved nothing


def test_fetcher_failures_are_raised_on_the_mailbox_thread() -> None:
    reader, handoff = harness([0.0])
    handoff.put(ValueError("bad header"))
    with pytest.raises(ValueError, match=r"^bad header$"):
        reader.poll_next(Collect())


def test_a_fetcher_thread_reads_splits_of_two_formats_to_the_end(tmp_path: Path) -> None:
    jsonl = tmp_path / "a.jsonl"
    jsonl.write_bytes(
        b"\n".join(
            orjson.dumps(
                {
                    "region": "eu",
                    "order_no": i,
                    "placed_at": (T0 + timedelta(seconds=i)).isoformat(),
                    "total": i,
                }
            )
            for i in range(100)
        )
        + b"\n{torn\n"
    )
    csv = tmp_path / "b.csv"
    csv.write_bytes(b"order_no,region,total,placed_at\n7,us,1.5,2026-01-02T00:00:00Z\n")
    splits = [
        file_assignment(1, str(jsonl), 0, None),
        file_assignment(2, str(csv), 0, None, kind="csv"),
    ]
    router = FormatRouter(ORDERS, max_line_bytes=1 << 10, dsn="unused", block_bytes=512)
    handoff = HandoffQueue(capacity=2)
    fetcher = SplitFetcher(router, handoff, lambda: [splits.pop(0)] if splits else [], [])
    reader = SourceReaderBase(fetcher, handoff, RecordEmitter())
    out = Collect()
    reader.start()
    try:
        while (status := reader.poll_next(out)) is not InputStatus.END_OF_INPUT:
            if status is InputStatus.NOTHING_AVAILABLE:
                reader.is_available().result(timeout=30)
    finally:
        reader.close()
    rows = pa.concat_batches([b.rows for b in out.blocks]).to_pylist()
    assert [(r["region"], r["order_no"]) for r in rows] == [
        *(("eu", i) for i in range(100)),
        ("us", 7),
    ]
    assert rows[-1][OFFSET] == 32
    assert [(s, o) for s, o, _, _ in out.finished] == [
        (1, jsonl.stat().st_size),
        (2, csv.stat().st_size),
    ]
    assert [(split, reason[:12]) for split, _, _, reason in out.dead] == [(1, "invalid JSON")]


class Timeline(Collect):
    """Collect that also records the order of split starts and ends on the mailbox side."""

    def __init__(self) -> None:
        super().__init__()
        self.events: list[str] = []

    def split_added(self, assignment: SplitAssignment, state: SplitState) -> None:
        super().split_added(assignment, state)
        self.events.append(f"add {assignment.split_id}")

    def split_finished(self, split_id: int, state: SplitState) -> None:
        super().split_finished(split_id, state)
        self.events.append(f"end {split_id}")


def test_a_batch_of_pulled_splits_joins_the_reader_one_at_a_time(tmp_path: Path) -> None:
    # One request hands out three splits (as SplitStore.pull_splits does for small files):
    # each must start only after the one before it ended (per-split state and watermarks are
    # exactly those of one-at-a-time pulls), and the split store is asked again only once
    # all three are read.
    files = []
    for n in range(3):
        path = tmp_path / f"{n}.jsonl"
        path.write_bytes(
            orjson.dumps(
                {
                    "region": "eu",
                    "order_no": n,
                    "placed_at": (T0 + timedelta(seconds=n)).isoformat(),
                    "total": n,
                }
            )
            + b"\n"
        )
        files.append(file_assignment(n + 1, str(path), 0, None))
    batches = [files, []]
    requests: list[int] = []

    def request() -> list[SplitAssignment]:
        requests.append(len(batches))
        return batches.pop(0) if batches else []

    router = FormatRouter(ORDERS, max_line_bytes=1 << 10, dsn="unused", block_bytes=512)
    handoff = HandoffQueue(capacity=2)
    reader = SourceReaderBase(SplitFetcher(router, handoff, request, []), handoff, RecordEmitter())
    out = Timeline()
    reader.start()
    try:
        while (status := reader.poll_next(out)) is not InputStatus.END_OF_INPUT:
            if status is InputStatus.NOTHING_AVAILABLE:
                reader.is_available().result(timeout=30)
    finally:
        reader.close()
    assert out.events == ["add 1", "end 1", "add 2", "end 2", "add 3", "end 3"]
    assert requests == [2, 1]  # the batch, then the empty answer that ends the input
    rows = pa.concat_batches([b.rows for b in out.blocks]).to_pylist()
    assert [r["order_no"] for r in rows] == [0, 1, 2]
