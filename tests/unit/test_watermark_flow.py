"""Watermark markers through a task's real operator chain (Map, Filter, async stages).

Two splits with different event-time progress feed the chain; after each batch the task
watermark (the minimum over both splits' watermarks, as ``SourceReaderBase.watermark``) is
pushed as a marker when it advances (``TaskWatermarks``). The async stages' functions keep
their ResultFutures and Hypothesis draws the order in which they complete. At the sink:
watermarks arrive in order, after every record pushed before them and before every record
pushed after them — ordered and event-time unordered alike — and no record arrives after a
watermark that covers its event time.

A real MailboxProcessor runs on an asyncio loop; time is virtual (no sleeps).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from hypothesis import given, settings
from hypothesis import strategies as st

from spark_jobs import AsyncMap, CoroutineAsyncFunction, FileSource, Filter, Map, Pipeline
from spark_jobs.async_io import AsyncFunction, ResultFuture, Watermark
from spark_jobs.async_io import OutputMode as AsyncMode
from spark_jobs.jobs._chain import OperatorChain
from spark_jobs.jobs._record_stage import RecordElement, RecordStage
from spark_jobs.jobs._stages import AsyncBatchStage, FilterStage, MapStage, Stage
from spark_jobs.jobs._user_functions import Completed
from spark_jobs.jobs._watermarks import TaskWatermarks, from_millis, to_millis
from spark_jobs.pipeline._steps import OutputMode
from spark_jobs.runtime import MailboxController, MailboxProcessor, ManualTimerService
from spark_jobs.source._batch import Batch, DeadLetter, with_offsets

TIMEOUT = 5.0
T0 = datetime(2026, 1, 1, tzinfo=UTC)
DELAY = timedelta(seconds=5)
PROPERTY = settings(derandomize=True, database=None, deadline=None, max_examples=60)


class Echo(CoroutineAsyncFunction[dict[str, Any], dict[str, Any]]):
    async def invoke(self, value: dict[str, Any]) -> list[dict[str, Any]]:
        return [{"tag": "x"}]


def plans(mode: OutputMode) -> Any:
    """Real stage plans: Map (identity) → Filter (keeps all) → AsyncMap per batch → per
    record. In key mode both are ordered per ``id``."""
    key = "id" if mode == "key" else None
    return Pipeline(
        name="wm",
        source=FileSource(schema={"id": "int64", "t": "timestamp"}, event_time="t"),
        steps=[
            Map(lambda batch: batch),
            Filter(pc.field("id") >= 0),
            AsyncMap(Echo(), output={"tag": "string"}, per="batch", mode=mode, key=key),
            AsyncMap(Echo(), output={"tag2": "string"}, mode=mode, key=key),
        ],
    ).plan.stages


class Held(AsyncFunction[Any, Any]):
    """Keeps every ResultFuture for the test to complete (with the batch, or a Completed)."""

    def __init__(self, answer: Callable[[Any], list[Any]]) -> None:
        self.answer = answer
        self.pending: list[tuple[Any, ResultFuture[Any]]] = []

    def async_invoke(self, value: Any, result_future: ResultFuture[Any]) -> None:
        self.pending.append((value, result_future))


def batch_answer(batch: Batch) -> list[Any]:
    rows = batch.rows
    tagged = rows.add_column(rows.num_columns - 1, "tag", pa.array(["x"] * rows.num_rows))
    return [Batch(batch.split_id, tagged, batch.span, batch.only)]


def record_answer(element: RecordElement) -> list[Any]:
    return [Completed(element, [{"tag2": "y"}])]


class Sink:
    """The end of the chain: records (split, offset, event time) and watermarks, in order."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, Any]] = []
        self.marks = TaskWatermarks(lambda _m: None, lambda: None)

    def write(self, batch: Batch) -> None:
        times = batch.rows.column("t").to_pylist()
        offsets = batch.rows.column(batch.rows.num_columns - 1).to_pylist()
        for when, offset in zip(times, offsets, strict=True):
            self.seen.append(("record", (batch.split_id, offset, when.replace(tzinfo=UTC))))

    def dead_letters(self, split_id: int, dead: list[DeadLetter]) -> None:
        raise AssertionError(dead)

    def count_dropped(self, records: int) -> None:
        assert records == 0

    def watermark(self, marker: Watermark) -> None:
        self.marks.reached_sink(marker)  # fails if a marker arrives out of order
        self.seen.append(("watermark", marker.timestamp))


def make_batch(split_id: int, offset: int, seconds: list[int]) -> Batch:
    rows = pa.RecordBatch.from_pydict(
        {
            "id": pa.array(range(len(seconds)), pa.int64()),
            "t": pa.array([T0 + timedelta(seconds=s) for s in seconds], pa.timestamp("us")),
        }
    )
    offsets = [offset + i for i in range(len(seconds))]
    return Batch(split_id, with_offsets(rows, offsets), (offsets[0], offsets[-1] + 1))


class Task:
    """Feeds batches of two splits (event time rising at different speeds) and the task
    watermark into the chain, one input per default-action call."""

    def __init__(self, mode: OutputMode, inputs: list[tuple[int, list[int]]]) -> None:
        self.processor = MailboxProcessor(self._default_action, debug=True)
        stage_plans = plans(mode)
        self.functions = [Held(batch_answer), Held(record_answer)]
        operator_mode = AsyncMode(mode)
        key = ("id",) if mode == "key" else None
        stages: list[Stage] = [
            MapStage(stage_plans[0]),
            FilterStage(stage_plans[1]),
            AsyncBatchStage(
                stage_plans[2],
                self.functions[0],
                self.processor,
                capacity=3,
                mode=operator_mode,
                key=key,
                timeout=None,
            ),
            RecordStage(
                stage_plans[3],
                self.functions[1],
                self.processor,
                capacity=4,
                mode=operator_mode,
                key=key,
                timeout=None,
            ),
        ]
        self.sink = Sink()
        self.chain = OperatorChain(stages, self.sink)
        self.split_marks: dict[int, datetime] = {}
        self.watermarks = TaskWatermarks(self.chain.push_watermark, self._task_watermark)
        self.inputs = deque(inputs)
        self.offsets = {0: 0, 1: 0}
        #: What entered the chain, in order: ("record", key) and ("watermark", ms).
        self.fed: list[tuple[str, Any]] = []

    def _task_watermark(self) -> datetime | None:
        if len(self.split_marks) < 2:
            return None  # a split without a watermark yet holds the task watermark back
        return min(self.split_marks.values())

    def _default_action(self, controller: MailboxController) -> None:
        chain = self.chain
        if not self.inputs:
            controller.suspend_default_action()
            chain.notify_when_drained(controller.all_actions_completed)
            return
        if not chain.has_capacity():
            chain.notify_when_available(controller.suspend_default_action().resume)
            return
        split_id, seconds = self.inputs.popleft()
        batch = make_batch(split_id, self.offsets[split_id], seconds)
        self.offsets[split_id] += len(seconds)
        for offset, s in zip(range(batch.span[0], batch.span[1]), seconds, strict=True):
            self.fed.append(("record", (split_id, offset, T0 + timedelta(seconds=s))))
        chain.push(batch)
        latest = T0 + timedelta(seconds=max(seconds)) - DELAY
        self.split_marks[split_id] = max(self.split_marks.get(split_id, latest), latest)
        if self.watermarks.offer(force=True):
            assert self.watermarks.emitted is not None
            self.fed.append(("watermark", self.watermarks.emitted))

    async def run(self, picks: list[int]) -> None:
        task = asyncio.ensure_future(self.processor.run_loop())
        picks_left = deque(picks)

        def idle() -> bool:
            return (
                self.processor.is_default_action_suspended and not self.processor.mailbox.has_mail()
            )

        async def drive() -> None:
            while not task.done():
                pending = [f for f in self.functions if f.pending]
                if not (idle() and pending):
                    await asyncio.sleep(0)
                    continue
                function = pending[(picks_left.popleft() if picks_left else 0) % len(pending)]
                index = (picks_left.popleft() if picks_left else 0) % len(function.pending)
                value, future = function.pending.pop(index)
                future.complete(function.answer(value))
            task.result()

        await asyncio.wait_for(drive(), TIMEOUT)


def progress() -> st.SearchStrategy[list[tuple[int, list[int]]]]:
    """Batches of split 0 (fast: +10 s per batch) and split 1 (slow: +2 s), each batch's
    event times rising within the batch and never below its split's previous batch."""
    return st.lists(st.sampled_from([0, 1]), min_size=2, max_size=14).map(_batches)


def _batches(order: list[int]) -> list[tuple[int, list[int]]]:
    step = {0: 10, 1: 2}
    clock = {0: 0, 1: 0}
    out = []
    for split_id in order:
        base = clock[split_id]
        out.append((split_id, [base, base + 1]))
        clock[split_id] = base + step[split_id]
    return out


def check(fed: list[tuple[str, Any]], seen: list[tuple[str, Any]]) -> None:
    assert sorted(map(repr, seen)) == sorted(map(repr, fed))  # everything, once
    marks_fed = [v for kind, v in fed if kind == "watermark"]
    marks_seen = [v for kind, v in seen if kind == "watermark"]
    assert marks_seen == marks_fed == sorted(set(marks_fed))  # in order, increasing
    # Every record sits between the same two watermarks at the sink as on input.
    before_fed = _watermarks_before(fed)
    before_seen = _watermarks_before(seen)
    assert before_seen == before_fed
    # ... and a record that arrives after a watermark is newer than it: no watermark reached
    # the sink before a record it bounds.
    for key, count in before_seen.items():
        if count:
            assert key[2] > from_millis(marks_seen[count - 1]), (key, marks_seen[count - 1])


def _watermarks_before(elements: list[tuple[str, Any]]) -> dict[Any, int]:
    passed, before = 0, {}
    for kind, value in elements:
        if kind == "watermark":
            passed += 1
        else:
            before[value] = passed
    return before


@PROPERTY
@given(progress(), st.lists(st.integers(0, 7), max_size=200))
def test_event_time_unordered_chain_never_moves_a_record_across_a_watermark(
    inputs: list[tuple[int, list[int]]], picks: list[int]
) -> None:
    task = Task("unordered", inputs)
    asyncio.run(task.run(picks))
    check(task.fed, task.sink.seen)
    assert task.sink.marks.at_sink == task.watermarks.emitted


@PROPERTY
@given(progress(), st.lists(st.integers(0, 7), max_size=200))
def test_ordered_chain_keeps_records_and_watermarks_in_input_order(
    inputs: list[tuple[int, list[int]]], picks: list[int]
) -> None:
    task = Task("ordered", inputs)
    asyncio.run(task.run(picks))
    assert task.sink.seen == task.fed
    check(task.fed, task.sink.seen)


@PROPERTY
@given(progress(), st.lists(st.integers(0, 7), max_size=200))
def test_key_chain_keeps_each_key_in_input_order_and_records_between_watermarks(
    inputs: list[tuple[int, list[int]]], picks: list[int]
) -> None:
    """Key mode on ``id`` (each batch holds ids 0 and 1, so the offset's parity is the key):
    per key the sink sees the records in input order; across keys, anything between the
    same two watermarks."""
    task = Task("key", inputs)
    asyncio.run(task.run(picks))
    check(task.fed, task.sink.seen)

    def per_key(elements: list[tuple[str, Any]]) -> dict[int, list[Any]]:
        found: dict[int, list[Any]] = {0: [], 1: []}
        for kind, value in elements:
            if kind == "record":
                found[value[1] % 2].append(value)
        return found

    assert per_key(task.sink.seen) == per_key(task.fed)


def test_the_slow_split_holds_the_watermark_back() -> None:
    task = Task("unordered", [(0, [0, 1]), (0, [100, 101]), (1, [10, 11]), (0, [200, 201])])
    asyncio.run(task.run([]))
    marks = [from_millis(v) for kind, v in task.sink.seen if kind == "watermark"]
    # Split 1 joins at 11 s: the minimum is its watermark (6 s) until it moves on.
    assert marks == [T0 + timedelta(seconds=6)]


# -- TaskWatermarks: bounded rate, never backwards ------------------------------------------


def test_markers_advance_only_and_at_a_bounded_rate() -> None:
    now = [0.0]
    current: list[datetime | None] = [None]
    pushed: list[int] = []
    marks = TaskWatermarks(
        lambda m: pushed.append(m.timestamp), lambda: current[0], interval=0.2, clock=lambda: now[0]
    )
    assert not marks.offer()  # no watermark yet
    current[0] = T0
    assert marks.offer()
    current[0] = T0 + timedelta(seconds=1)
    assert not marks.offer()  # within 200 ms of the last marker
    now[0] = 0.1
    assert marks.offer(force=True)  # input pauses: goes at once
    current[0] = T0  # a split joined with an older watermark: no marker backwards
    now[0] = 1.0
    assert not marks.offer()
    current[0] = T0 + timedelta(seconds=2)
    assert marks.offer()
    assert [from_millis(p) for p in pushed] == [T0, T0 + timedelta(seconds=1), current[0]]
    assert marks.sink_watermark() is None  # nothing reached the sink yet
    marks.reached_sink(Watermark(pushed[0]))
    assert marks.sink_watermark() == "2026-01-01T00:00:00+00:00"


def test_millisecond_conversion_rounds_down_and_treats_naive_as_utc() -> None:
    moment = T0 + timedelta(microseconds=1999)
    assert to_millis(moment) == to_millis(T0) + 1
    assert to_millis(moment.replace(tzinfo=None)) == to_millis(moment)
    assert to_millis(T0 - timedelta(microseconds=1)) == to_millis(T0) - 1
    assert from_millis(to_millis(T0)) == T0


def test_periodic_ticks_offer_without_new_blocks() -> None:
    async def scenario() -> list[int]:
        pushed: list[int] = []
        current: list[datetime | None] = [T0]
        timers = ManualTimerService()

        def action(controller: MailboxController) -> None:
            controller.suspend_default_action()

        processor = MailboxProcessor(action)
        timers.bind(processor.executor())
        marks = TaskWatermarks(lambda m: pushed.append(m.timestamp), lambda: current[0])
        loop = asyncio.ensure_future(processor.run_loop())

        async def pushed_count(count: int) -> None:
            while len(pushed) < count:
                await asyncio.sleep(0)

        marks.start(timers)
        timers.advance(0.2)
        await asyncio.wait_for(pushed_count(1), TIMEOUT)
        current[0] = T0 + timedelta(seconds=3)  # e.g. the slow split went idle
        timers.advance(0.2)
        await asyncio.wait_for(pushed_count(2), TIMEOUT)
        marks.stop()
        timers.advance(1.0)
        assert timers.pending() == 0
        processor.executor().execute(processor.all_actions_completed, "stop")
        await asyncio.wait_for(loop, TIMEOUT)
        return pushed

    pushed = asyncio.run(scenario())
    assert [from_millis(p) for p in pushed] == [T0, T0 + timedelta(seconds=3)]


def test_a_retried_attempt_resumes_the_committed_sink_watermark() -> None:
    pushed: list[int] = []
    current: list[datetime | None] = [T0 + timedelta(seconds=5)]
    marks = TaskWatermarks(lambda m: pushed.append(m.timestamp), lambda: current[0])
    marks.resume(T0 + timedelta(seconds=10))
    assert marks.sink_watermark() == "2026-01-01T00:00:10+00:00"  # before any new marker
    assert not marks.offer(force=True)  # a restored split behind it: no marker backwards
    current[0] = T0 + timedelta(seconds=11)
    assert marks.offer(force=True)
    assert [from_millis(p) for p in pushed] == [T0 + timedelta(seconds=11)]
    marks.resume(None)  # nothing committed: unchanged
    assert marks.emitted == to_millis(T0 + timedelta(seconds=11))
