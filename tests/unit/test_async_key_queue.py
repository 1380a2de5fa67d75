"""KeyOrderedQueue alone (Flink's FLIP-519 key-ordered mode): driven as the operator drives
it, under completion orders Hypothesis draws. Oracle: the input (values are positions, keys
drawn), see ``test_async_key_order``."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from spark_jobs.async_io import KeyOrderedQueue, Marker, Output, QueueEntry, StreamRecord
from tests.unit.test_async_key_order import PROPERTY, Element, keyed_inputs


class Sink:
    def __init__(self) -> None:
        self.out: list[Element] = []
        self.output: Output[Any] = Output(
            lambda value, ts: self.out.append(StreamRecord(value, ts)), self.out.append
        )


def simulate(
    inputs: list[Element], keys: dict[int, int], capacity: int, pick: Any
) -> tuple[list[Element], list[int]]:
    """Drive a KeyOrderedQueue as the operator does: put when there is room (``pick(None)``
    decides put or complete), invoke what the queue lets start, complete an invoked record
    chosen by ``pick(n)``. Checks at every step that the queue holds at most ``capacity``
    elements and that a record starts only after every earlier record of its key completed.
    Returns the output and the invocation order."""
    queue: KeyOrderedQueue[Any] = KeyOrderedQueue(capacity, keys_of=lambda v: (keys[v],))
    sink = Sink()
    running: list[QueueEntry[Any]] = []
    completed: set[int] = set()
    invoked: list[int] = []

    def start(entry: QueueEntry[Any]) -> None:
        position = entry.value
        early = [p for p in keys if p < position and keys[p] == keys[position]]
        assert all(p in completed for p in early), f"{position} started before {early}"
        invoked.append(position)
        running.append(entry)

    next_input = 0
    while next_input < len(inputs) or running:
        can_put = next_input < len(inputs) and queue.has_capacity()
        assert can_put or running, "stuck: full (or done reading), nothing invoked"
        if can_put and (not running or pick(None)):
            element = inputs[next_input]
            next_input += 1
            entry = queue.try_put(element)
            assert entry is not None
            if isinstance(element, StreamRecord) and not entry.blockers:
                start(entry)
        else:
            entry = running.pop(pick(len(running)))
            entry.results = [entry.value]
            completed.add(entry.value)
            for released in queue.on_completed(entry):
                start(released)
        queue.emit_completed(sink.output)
        assert len(queue) <= capacity
    assert queue.is_empty() and queue.waiting == 0
    return sink.out, invoked


kinds_strategy = st.lists(st.one_of(st.none(), st.integers(0, 3)), max_size=24)


@PROPERTY
@given(kinds=kinds_strategy, capacity=st.integers(1, 8), data=st.data())
def test_queue_keeps_key_order_and_watermarks_under_any_completion_order(
    kinds: list[int | None], capacity: int, data: st.DataObject
) -> None:
    inputs, keys = keyed_inputs(kinds)

    def pick(n: int | None) -> Any:
        if n is None:
            return data.draw(st.booleans(), label="put")
        return data.draw(st.integers(0, n - 1), label="complete")

    out, invoked = simulate(inputs, keys, capacity, pick)
    assert Counter(map(repr, out)) == Counter(map(repr, inputs))
    for key in set(keys.values()):
        mine = [p for p in keys if keys[p] == key]
        assert [e.value for e in out if isinstance(e, StreamRecord) and e.value in mine] == mine
        assert [p for p in invoked if p in mine] == mine
    position = {id(e): i for i, e in enumerate(out)}
    for w in (e for e in inputs if isinstance(e, Marker)):
        for r in (e for e in inputs if isinstance(e, StreamRecord)):
            before = r.value < w.timestamp  # type: ignore[attr-defined]
            r_out = next(i for i, e in enumerate(out) if e == r)
            assert (r_out < position[id(w)]) == before, f"{r!r} crossed {w!r}"


@pytest.mark.parametrize("capacity", [4, 10])
def test_queue_different_keys_overtake_same_key_does_not(capacity: int) -> None:
    """Completions in reverse: records of different keys leave reversed (they ran at once);
    records of one key leave in input order (only the first was even started)."""
    distinct, one_key = keyed_inputs(list(range(4))), keyed_inputs([7] * 4)
    newest_first = lambda n: True if n is None else n - 1  # noqa: E731  (read all first)
    out, invoked = simulate(*distinct, capacity, newest_first)
    assert [e.value for e in out if isinstance(e, StreamRecord)] == [3, 2, 1, 0]
    assert invoked == [0, 1, 2, 3]
    out, _ = simulate(*one_key, capacity, newest_first)
    assert [e.value for e in out if isinstance(e, StreamRecord)] == [0, 1, 2, 3]


def test_queue_block_with_several_keys_waits_for_each() -> None:
    """A block (several keys) starts once every earlier element sharing any key completed;
    blocks of disjoint keys start at once."""
    blocks = {0: ("a", "b"), 1: ("c",), 2: ("b", "c"), 3: ("d",)}
    queue: KeyOrderedQueue[Any] = KeyOrderedQueue(10, keys_of=blocks.__getitem__)
    entries = [queue.try_put(StreamRecord(v, v)) for v in range(4)]
    assert [e.blockers if e else None for e in entries] == [0, 0, 2, 0]
    first, second, third, _ = entries
    assert first and second and third
    first.results = []
    assert list(queue.on_completed(first)) == []  # still waits for block 1 (key c)
    second.results = []
    assert list(queue.on_completed(second)) == [third]
    assert queue.values() == [StreamRecord(v, v) for v in range(4)]
