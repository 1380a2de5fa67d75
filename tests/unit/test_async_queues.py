"""OrderedQueue / UnorderedQueue: emission order, marker boundaries, capacity, values()."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spark_jobs.async_io import (
    Marker,
    OrderedQueue,
    Output,
    QueueEntry,
    StreamElementQueue,
    StreamRecord,
    UnorderedQueue,
    Watermark,
)

Element = StreamRecord[Any] | Marker


class Sink:
    """An Output that records what left the queue: results as StreamRecords, markers as is."""

    def __init__(self) -> None:
        self.out: list[Element] = []
        self.output: Output[Any] = Output(
            lambda value, ts: self.out.append(StreamRecord(value, ts)), self.out.append
        )


def rec(value: int) -> StreamRecord[int]:
    return StreamRecord(value, value)


def wm(timestamp: int) -> Watermark:
    return Watermark(timestamp=timestamp)


def put(queue: StreamElementQueue[Any], element: Element) -> QueueEntry[Any]:
    entry = queue.try_put(element)
    assert entry is not None, f"queue unexpectedly full for {element!r}"
    return entry


def complete(
    queue: StreamElementQueue[Any], entry: QueueEntry[Any], sink: Sink, results: list[Any]
) -> int:
    """What the operator does on a completion: record results, notify, emit."""
    entry.results = results
    queue.on_completed(entry)
    return queue.emit_completed(sink.output)


def echo(entry: QueueEntry[Any]) -> list[Any]:
    element = entry.element
    assert isinstance(element, StreamRecord)
    return [element.value]


# -- ordered ---------------------------------------------------------------------------------


def test_ordered_queue_waits_for_the_head() -> None:
    queue: OrderedQueue[Any] = OrderedQueue(capacity=3)
    sink = Sink()
    entries = [put(queue, rec(v)) for v in (1, 2, 3)]
    assert complete(queue, entries[2], sink, [3]) == 0
    assert complete(queue, entries[1], sink, [2]) == 0
    assert sink.out == []
    assert complete(queue, entries[0], sink, [1]) == 3
    assert sink.out == [rec(1), rec(2), rec(3)]
    assert queue.is_empty()


def test_ordered_queue_emits_markers_in_place() -> None:
    queue: OrderedQueue[Any] = OrderedQueue(capacity=4)
    sink = Sink()
    first = put(queue, rec(1))
    put(queue, wm(1))
    second = put(queue, rec(2))
    assert queue.emit_completed(sink.output) == 0  # the watermark waits behind record 1
    complete(queue, second, sink, [2])
    assert sink.out == []
    complete(queue, first, sink, [1])
    assert sink.out == [rec(1), wm(1), rec(2)]


def test_results_may_be_empty_or_many_and_keep_the_input_timestamp() -> None:
    queue: OrderedQueue[Any] = OrderedQueue(capacity=2)
    sink = Sink()
    none = put(queue, StreamRecord("a", 10))
    many = put(queue, StreamRecord("b", 20))
    complete(queue, many, sink, ["b1", "b2"])
    complete(queue, none, sink, [])
    assert sink.out == [StreamRecord("b1", 20), StreamRecord("b2", 20)]
    assert queue.is_empty()


# -- unordered -------------------------------------------------------------------------------


def test_unordered_queue_emits_in_completion_order_without_markers() -> None:
    queue: UnorderedQueue[Any] = UnorderedQueue(capacity=3)
    sink = Sink()
    entries = [put(queue, rec(v)) for v in (1, 2, 3)]
    assert complete(queue, entries[2], sink, [3]) == 1
    assert complete(queue, entries[0], sink, [1]) == 1
    assert complete(queue, entries[1], sink, [2]) == 1
    assert sink.out == [rec(3), rec(1), rec(2)]
    assert queue.is_empty()


def test_unordered_queue_never_emits_across_a_watermark() -> None:
    queue: UnorderedQueue[Any] = UnorderedQueue(capacity=5)
    sink = Sink()
    r1 = put(queue, rec(1))
    r2 = put(queue, rec(2))
    put(queue, wm(2))
    r3 = put(queue, rec(3))
    r4 = put(queue, rec(4))
    assert queue.emit_completed(sink.output) == 0

    assert complete(queue, r4, sink, [4]) == 0  # behind the watermark
    assert complete(queue, r2, sink, [2]) == 1  # before it: leaves at once
    assert sink.out == [rec(2)]
    assert complete(queue, r1, sink, [1]) == 3  # record 1, then the watermark, then record 4
    assert sink.out == [rec(2), rec(1), wm(2), rec(4)]
    assert complete(queue, r3, sink, [3]) == 1
    assert sink.out[-1] == rec(3)
    assert queue.is_empty()


def test_unordered_queue_records_join_the_open_segment_after_draining() -> None:
    queue: UnorderedQueue[Any] = UnorderedQueue(capacity=2)
    sink = Sink()
    r1 = put(queue, rec(1))
    complete(queue, r1, sink, [1])
    r2 = put(queue, rec(2))  # same (open) segment as record 1
    put(queue, wm(2))
    assert queue.try_put(rec(3)) is None  # capacity 2: record 2 and the watermark
    complete(queue, r2, sink, [2])
    assert sink.out == [rec(1), rec(2), wm(2)]
    assert queue.is_empty()


def test_consecutive_markers_leave_together_once_unblocked() -> None:
    queue: UnorderedQueue[Any] = UnorderedQueue(capacity=4)
    sink = Sink()
    r1 = put(queue, rec(1))
    put(queue, wm(1))
    put(queue, Marker(payload="end of split"))
    r2 = put(queue, rec(2))
    complete(queue, r2, sink, [2])
    assert sink.out == []
    complete(queue, r1, sink, [1])
    assert sink.out == [rec(1), wm(1), Marker(payload="end of split"), rec(2)]


# -- capacity --------------------------------------------------------------------------------


@pytest.mark.parametrize("queue_type", [OrderedQueue, UnorderedQueue])
def test_capacity_must_be_positive(queue_type: type[StreamElementQueue[Any]]) -> None:
    with pytest.raises(ValueError, match="capacity"):
        queue_type(0)


@pytest.mark.parametrize("queue_type", [OrderedQueue, UnorderedQueue])
def test_try_put_returns_none_when_full_and_markers_take_a_slot(
    queue_type: type[StreamElementQueue[Any]],
) -> None:
    queue = queue_type(2)
    sink = Sink()
    r1 = put(queue, rec(1))
    put(queue, wm(1))
    assert len(queue) == 2
    assert not queue.has_capacity()
    assert queue.try_put(rec(2)) is None
    assert queue.try_put(wm(2)) is None
    assert len(queue) == 2
    complete(queue, r1, sink, [1])  # frees both slots: the record and the watermark behind it
    assert len(queue) == 0
    assert queue.has_capacity()
    assert queue.try_put(rec(2)) is not None
    assert sink.out == [rec(1), wm(1)]


@pytest.mark.parametrize("queue_type", [OrderedQueue, UnorderedQueue])
def test_a_marker_at_the_head_leaves_on_the_next_emit(
    queue_type: type[StreamElementQueue[Any]],
) -> None:
    queue = queue_type(1)
    sink = Sink()
    put(queue, wm(7))
    assert queue.try_put(rec(1)) is None
    assert queue.emit_completed(sink.output) == 1
    assert sink.out == [wm(7)]
    assert queue.has_capacity()


# -- values() --------------------------------------------------------------------------------


@pytest.mark.parametrize("queue_type", [OrderedQueue, UnorderedQueue])
def test_values_lists_unemitted_elements_in_input_order(
    queue_type: type[StreamElementQueue[Any]],
) -> None:
    queue = queue_type(6)
    sink = Sink()
    r1 = put(queue, rec(1))
    r2 = put(queue, rec(2))
    put(queue, wm(2))
    r3 = put(queue, rec(3))
    r4 = put(queue, rec(4))
    complete(queue, r4, sink, [4])  # completed, but blocked behind the watermark
    complete(queue, r3, sink, [3])
    assert queue.values() == [rec(1), rec(2), wm(2), rec(3), rec(4)]
    complete(queue, r1, sink, [1])
    assert sink.out == [rec(1)]
    assert queue.values() == [rec(2), wm(2), rec(3), rec(4)]
    complete(queue, r2, sink, [2])
    assert queue.values() == []
    assert len(sink.out) == 5


def test_unordered_values_keep_input_order_within_a_segment() -> None:
    queue: UnorderedQueue[Any] = UnorderedQueue(10)
    sink = Sink()
    put(queue, rec(0))  # never completes: blocks the watermark
    put(queue, wm(0))
    later = [put(queue, rec(v)) for v in range(1, 8)]
    for entry in reversed(later):
        complete(queue, entry, sink, echo(entry))
    assert sink.out == []
    assert queue.values() == [rec(0), wm(0), *(rec(v) for v in range(1, 8))]


# -- properties over random schedules ---------------------------------------------------------


def build_inputs(kinds: list[bool]) -> list[Element]:
    """True = watermark, False = record; record values and watermark timestamps are unique."""
    return [wm(i) if is_marker else rec(i) for i, is_marker in enumerate(kinds)]


def simulate(
    queue: StreamElementQueue[Any], inputs: list[Element], data: st.DataObject
) -> list[Element]:
    """Interleave puts (when there is room) and completions of random in-flight records.

    After every step checks values() and that nothing that may leave is held back.
    """
    sink = Sink()
    pending: list[QueueEntry[Any]] = []
    completed: set[int] = set()  # input indexes of completed records
    next_input = 0

    def emitted() -> list[bool]:
        left = {id(e) for e in sink.out if isinstance(e, Marker)}
        values = {e.value for e in sink.out if isinstance(e, StreamRecord)}
        return [
            (id(e) in left) if isinstance(e, Marker) else (e.value in values)
            for e in inputs[:next_input]
        ]

    while next_input < len(inputs) or pending:
        can_put = next_input < len(inputs) and queue.has_capacity()
        assert can_put or pending, "queue is stuck: full, yet nothing in flight can complete"
        if can_put and (not pending or data.draw(st.booleans(), label="put")):
            element = inputs[next_input]
            entry = put(queue, element)
            if isinstance(element, StreamRecord):
                pending.append(entry)
            next_input += 1
            queue.emit_completed(sink.output)
        else:
            index = data.draw(st.integers(0, len(pending) - 1), label="complete")
            entry = pending.pop(index)
            completed.add(inputs.index(entry.element))
            complete(queue, entry, sink, echo(entry))

        left = emitted()
        held = [e for e, gone in zip(inputs[:next_input], left, strict=True) if not gone]
        assert queue.values() == held
        assert len(queue) == len(held)
        for i, gone in enumerate(left):
            element = inputs[i]
            ready = isinstance(element, Marker) or i in completed
            if gone or not ready:
                continue
            before = [inputs[j] for j in range(i) if not left[j]]
            if isinstance(queue, OrderedQueue) or isinstance(element, Marker):
                assert before, f"{element!r} could leave but was held back"
            else:
                assert any(isinstance(e, Marker) for e in before), (
                    f"{element!r} completed and is not behind a marker, but was held back"
                )
    assert queue.is_empty()
    return sink.out


kinds_strategy = st.lists(st.booleans(), max_size=24)
PROPERTY_SETTINGS = settings(database=None, deadline=None, max_examples=150)


@PROPERTY_SETTINGS
@given(kinds=kinds_strategy, capacity=st.integers(1, 8), data=st.data())
def test_ordered_output_equals_input_order(
    kinds: list[bool], capacity: int, data: st.DataObject
) -> None:
    inputs = build_inputs(kinds)
    out = simulate(OrderedQueue(capacity), inputs, data)
    assert out == inputs


@PROPERTY_SETTINGS
@given(kinds=kinds_strategy, capacity=st.integers(1, 8), data=st.data())
def test_unordered_never_reorders_across_watermarks(
    kinds: list[bool], capacity: int, data: st.DataObject
) -> None:
    inputs = build_inputs(kinds)
    out = simulate(UnorderedQueue(capacity), inputs, data)
    position = {id(e): i for i, e in enumerate(out) if isinstance(e, Marker)}
    emitted_at = {e.value: i for i, e in enumerate(out) if isinstance(e, StreamRecord)}
    for w_index, w in enumerate(inputs):
        if not isinstance(w, Marker):
            continue
        w_out = position[id(w)]
        for r_index, r in enumerate(inputs):
            if isinstance(r, StreamRecord):
                if r_index < w_index:
                    assert emitted_at[r.value] < w_out, f"{r!r} emitted after later {w!r}"
                else:
                    assert emitted_at[r.value] > w_out, f"{r!r} emitted before earlier {w!r}"
    assert [e for e in out if isinstance(e, Marker)] == [e for e in inputs if isinstance(e, Marker)]


@PROPERTY_SETTINGS
@given(
    kinds=kinds_strategy,
    capacity=st.integers(1, 8),
    ordered=st.booleans(),
    data=st.data(),
)
def test_every_record_is_emitted_exactly_once(
    kinds: list[bool], capacity: int, ordered: bool, data: st.DataObject
) -> None:
    inputs = build_inputs(kinds)
    queue: StreamElementQueue[Any] = OrderedQueue(capacity) if ordered else UnorderedQueue(capacity)
    out = simulate(queue, inputs, data)
    emitted = Counter(e.value for e in out if isinstance(e, StreamRecord))
    expected = Counter(e.value for e in inputs if isinstance(e, StreamRecord))
    assert emitted == expected
    assert all(n == 1 for n in emitted.values())
    assert len(out) == len(inputs)
