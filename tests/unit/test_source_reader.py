"""SourceReaderBase on the mailbox side: per-split state and watermarks, idleness, end of input.

Batches are put on the hand-off queue by the test (no fetcher thread); time is a fake clock.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from enumerator_service import FileSplit, SplitAssignment, SplitState
from spark_jobs.source import (
    Event,
    FormatRouter,
    HandoffQueue,
    InputStatus,
    RawLine,
    RecordEmitter,
    RecordsWithSplitIds,
    SourceReaderBase,
)

T0 = datetime(2026, 1, 1, tzinfo=UTC)


class NoFetcher:
    def start(self) -> None: ...
    def shutdown(self) -> None: ...


class Collect:
    def __init__(self) -> None:
        self.events: list[Event] = []
        self.dead: list[tuple[int, str]] = []
        self.finished: list[tuple[int, int]] = []

    def split_added(self, assignment: SplitAssignment, state: SplitState) -> None: ...

    def collect(self, event: Event, timestamp: int) -> None:
        self.events.append(event)

    def dead_letter(self, split_id: int, line: RawLine, reason: str) -> None:
        self.dead.append((split_id, reason))

    def split_finished(self, split_id: int, state: SplitState) -> None:
        self.finished.append((split_id, state.offset))


def line(offset: int, event_id: str, seconds: int) -> RawLine:
    when = (T0 + timedelta(seconds=seconds)).isoformat()
    data = (
        f'{{"event_id": "{event_id}", "user_id": 1, "event_time": "{when}", '
        f'"event_type": "click", "amount": 0}}'
    ).encode()
    return RawLine(offset, offset + len(data) + 1, data)


def harness(now: list[float]) -> tuple[SourceReaderBase, HandoffQueue, FormatRouter]:
    handoff = HandoffQueue(capacity=16)
    router = FormatRouter(max_line_bytes=1 << 16, dsn="postgresql://unused")
    emitter = RecordEmitter(
        router, out_of_orderness=timedelta(seconds=5), idle_timeout=30.0, clock=lambda: now[0]
    )
    reader = SourceReaderBase(NoFetcher(), handoff, emitter)  # type: ignore[arg-type]
    return reader, handoff, router


def assignment(router: FormatRouter, split_id: int) -> SplitAssignment:
    a = SplitAssignment(split_id, FileSplit("s", "jsonl", f"/f{split_id}", 0, None, None), 1, 0)
    router.add_split(a)
    return a


def drain(reader: SourceReaderBase, out: Any) -> InputStatus:
    while (status := reader.poll_next(out)) is InputStatus.MORE_AVAILABLE:
        pass
    return status


def test_task_watermark_is_the_minimum_over_active_splits_and_idle_ones_drop_out() -> None:
    now = [0.0]
    reader, handoff, router = harness(now)
    out = Collect()
    a, b = assignment(router, 1), assignment(router, 2)
    handoff.put(RecordsWithSplitIds(added=[a, b], records={1: [line(0, "a1", 100)]}))
    handoff.put(RecordsWithSplitIds(records={2: [line(0, "b1", 40)]}))
    assert drain(reader, out) is InputStatus.NOTHING_AVAILABLE
    # Each split's watermark is its max event time minus the bounded out-of-orderness.
    assert reader.split_states[1].watermark == T0 + timedelta(seconds=95)
    assert reader.watermark() == T0 + timedelta(seconds=35)  # split 2 holds it back

    now[0] = 20.0
    handoff.put(RecordsWithSplitIds(records={1: [line(200, "a2", 160)]}))
    drain(reader, out)
    now[0] = 45.0  # split 2 silent for 45 s > 30 s: idle; split 1 active (last record at 20)
    assert reader.idle_splits() == [2]
    assert reader.watermark() == T0 + timedelta(seconds=155)

    handoff.put(RecordsWithSplitIds(records={2: [line(300, "b2", 50)]}))
    drain(reader, out)  # a record makes split 2 active again
    assert reader.idle_splits() == []
    assert reader.watermark() == T0 + timedelta(seconds=45)
    assert [e.event_id for e in out.events] == ["a1", "b1", "a2", "b2"]


def test_split_state_offsets_follow_emission_and_end_of_input_ends() -> None:
    now = [0.0]
    reader, handoff, router = harness(now)
    out = Collect()
    a = assignment(router, 7)
    bad = RawLine(50, 60, b"{not json")
    good = line(0, "x", 1)
    handoff.put(RecordsWithSplitIds(added=[a], records={7: [good, bad]}, finished=[7]))
    handoff.put(RecordsWithSplitIds(end_of_input=True))
    assert drain(reader, out) is InputStatus.END_OF_INPUT
    assert [e.event_id for e in out.events] == ["x"]
    assert out.dead == [(7, out.dead[0][1])]
    assert out.dead[0][1].startswith("invalid JSON")
    assert out.finished == [(7, 60)]  # the offset after the last record, dead letters included
