"""Key-ordered mode of the async operator (Flink's FLIP-519): the operator in OutputMode.KEY
under completion orders Hypothesis draws (no clock, no sleeps), and its snapshot/restore with
queued keys (the queue alone: ``test_async_key_queue``).

The oracle is the input itself: record values and watermark timestamps are input positions,
each record's key is drawn, so per-key input order, the watermarks before each record and
the expected multiset are computed from the input, independently of the queue.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spark_jobs.async_io import (
    OutputMode,
    ResultFuture,
    StreamRecord,
    Watermark,
)
from tests.unit.test_async_operator_properties import (
    Element,
    Function,
    Harness,
    complete_randomly,
    complete_some,
    expected_output,
    results_for,
)

KEY = OutputMode.KEY
PROPERTY = settings(derandomize=True, database=None, deadline=None, max_examples=120)


def keyed_inputs(kinds: list[int | None]) -> tuple[list[Element], dict[int, int]]:
    """``None`` is a watermark, an int a record of that key; values/timestamps are positions.
    Returns the inputs and each record position's key."""
    inputs: list[Element] = []
    keys: dict[int, int] = {}
    for i, kind in enumerate(kinds):
        if kind is None:
            inputs.append(Watermark(timestamp=i))
        else:
            inputs.append(StreamRecord(i, i))
            keys[i] = kind
    return inputs, keys


def check_output(out: list[Element], inputs: list[Element], keys: dict[int, int]) -> None:
    """Every input left exactly once, in input order per key, and no record crossed a
    watermark (the watermarks emitted before a record are those before it in the input)."""
    expected = expected_output(inputs)
    assert Counter(map(repr, out)) == Counter(map(repr, expected)), "duplicate or missing"
    per_key: dict[int, list[int]] = defaultdict(list)
    wanted: dict[int, list[int]] = defaultdict(list)
    for element in expected:
        if isinstance(element, StreamRecord):
            assert element.timestamp is not None
            wanted[keys[element.timestamp]].append(element.value)
    watermarks_before = 0
    watermark_positions = [e.timestamp for e in out if isinstance(e, Watermark)]
    assert watermark_positions == sorted(watermark_positions)
    for element in out:
        if isinstance(element, Watermark):
            watermarks_before += 1
            continue
        assert isinstance(element, StreamRecord) and element.timestamp is not None
        position = element.timestamp
        per_key[keys[position]].append(element.value)
        assert watermarks_before == sum(1 for w in watermark_positions if w < position), out
    assert per_key == wanted


# -- the operator ------------------------------------------------------------------------------


class KeyedFunction(Function):
    """Records completions; flags a record invoked before an earlier record of its key
    completed, and how many requests ran at once at most."""

    def __init__(self, keys: dict[int, int], *, immediate: bool) -> None:
        super().__init__(immediate=immediate)
        self.keys = keys
        self.completed: set[int] = set()
        self.violations: list[tuple[int, list[int]]] = []
        self.most_running = 0

    def async_invoke(self, value: int, result_future: ResultFuture[int]) -> None:
        early = [p for p in self.keys if p < value and self.keys[p] == self.keys[value]]
        missing = [p for p in early if p not in self.completed]
        if missing:
            self.violations.append((value, missing))
        super().async_invoke(value, _Logged(self, value, result_future))
        self.most_running = max(self.most_running, len(self.pending))


class _Logged(ResultFuture[int]):
    def __init__(self, owner: KeyedFunction, value: int, inner: ResultFuture[int]) -> None:
        self.owner, self.value, self.inner = owner, value, inner

    def complete(self, results: Iterable[int]) -> None:
        self.owner.completed.add(self.value)
        self.inner.complete(results)

    def complete_exceptionally(self, error: BaseException) -> None:
        self.inner.complete_exceptionally(error)


def key_of(keys: dict[int, int]) -> Any:
    return lambda value: (keys[value],)


@PROPERTY
@given(
    kinds=st.lists(st.one_of(st.none(), st.integers(0, 3)), min_size=1, max_size=14),
    capacity=st.integers(1, 5),
    respect_capacity=st.booleans(),
    data=st.data(),
)
def test_operator_key_mode_under_random_completions(
    kinds: list[int | None], capacity: int, respect_capacity: bool, data: st.DataObject
) -> None:
    inputs, keys = keyed_inputs(kinds)
    function = KeyedFunction(keys, immediate=False)
    h = Harness(
        function,
        inputs,
        mode=KEY,
        capacity=capacity,
        respect_capacity=respect_capacity,
        key=key_of(keys),
    )
    out = h.run(complete_randomly(data))
    check_output(out, inputs, keys)
    assert function.violations == []
    assert function.most_running <= capacity
    assert sorted(function.invoked) == sorted(keys), "every record invoked exactly once"
    assert h.operator.in_flight() == 0


def test_operator_reversed_completions_interleave_keys() -> None:
    """Keys a b a b (after a watermark), newest request completed first: b's first record
    leaves before a's."""
    inputs, keys = keyed_inputs([None, 0, 1, 0, 1])
    function = KeyedFunction(keys, immediate=False)
    h = Harness(function, inputs, mode=KEY, capacity=4, key=key_of(keys))

    async def newest_first(h: Harness) -> None:
        task = h.task
        assert task is not None
        while True:
            await h.wait_until(lambda: task.done() or (h.idle() and bool(function.pending)))
            if task.done():
                return
            value, future = function.pending.pop()
            future.complete(results_for(value))

    out = h.run(newest_first)
    check_output(out, inputs, keys)
    order = [e.timestamp for e in out if isinstance(e, StreamRecord)]
    assert order.index(2) < order.index(1), f"no record overtook another: {order}"
    assert function.invoked == [1, 2, 4, 3]  # 3 waited for 1, 4 only for 2


def test_key_is_required_with_key_mode_and_refused_otherwise() -> None:
    with pytest.raises(ValueError, match="key is required"):
        Harness(Function(immediate=True), [], mode=KEY, capacity=1)
    with pytest.raises(ValueError, match="key is required"):
        Harness(Function(immediate=True), [], mode=OutputMode.UNORDERED, capacity=1, key=hash)


# -- snapshot and restore with queued keys ---------------------------------------------------


def run_and_snapshot(
    inputs: list[Element], keys: dict[int, int], capacity: int, complete_first: list[int]
) -> tuple[list[Element], list[Element], list[Element], int]:
    """Feed what fits, complete the records ``complete_first`` (in that order, as they get
    invoked), snapshot; returns what was emitted before the snapshot, the snapshot, the input
    not read yet, and how many records of the snapshot were never invoked (waiting)."""
    function = KeyedFunction(keys, immediate=False)
    h = Harness(function, inputs, mode=KEY, capacity=capacity, hold_open=True, key=key_of(keys))
    taken: list[tuple[list[Element], int, list[Element]]] = []

    async def drive(h: Harness) -> None:
        await h.wait_until(h.idle)
        for position in complete_first:
            await h.wait_until(lambda p=position: any(v == p for v, _ in function.pending))
            index = next(i for i, (v, _) in enumerate(function.pending) if v == position)
            value, future = function.pending.pop(index)
            future.complete(results_for(value))
            await h.wait_until(h.idle)

        def snapshot() -> None:
            taken.append((h.operator.snapshot(), len(h.out), list(h.inputs)))

        h.processor.executor().execute(snapshot, "snapshot")
        await h.wait_until(lambda: bool(taken) and h.idle())
        h.processor.executor().execute(h.processor.all_actions_completed, "stop")

    h.run(drive)
    assert function.violations == []
    state, emitted, unread = taken[0]
    invoked = set(function.invoked)
    waiting = sum(1 for e in state if isinstance(e, StreamRecord) and e.value not in invoked)
    return h.out[:emitted], state, unread, waiting


def position_of(element: Element) -> int:
    if isinstance(element, StreamRecord):
        assert isinstance(element.value, int)
        return element.value
    assert isinstance(element, Watermark)
    return element.timestamp


@pytest.mark.parametrize("capacity", [8, 3])
def test_restore_with_queued_keys_equals_an_uninterrupted_run(capacity: int) -> None:
    # Keys a a b a c b, a watermark in the middle; record 2 (b) completes before the
    # snapshot, so b's second record waits for nothing while a's records wait for the first.
    inputs, keys = keyed_inputs([0, 0, 1, None, 0, 2, 1])
    uninterrupted = Harness(
        KeyedFunction(keys, immediate=True), inputs, mode=KEY, capacity=capacity, key=key_of(keys)
    ).run()
    check_output(uninterrupted, inputs, keys)

    before, state, unread, waiting = run_and_snapshot(inputs, keys, capacity, [2])
    # Capacity 8: all read, a's 2nd and 3rd records wait; capacity 3: a's 2nd waits.
    assert waiting == (2 if capacity == 8 else 1), state
    positions = [position_of(e) for e in state]
    assert positions == sorted(positions), "the snapshot keeps input order"
    assert 2 not in positions and 0 in positions, "completed-and-emitted left, others stay"

    # The restored operator completes newest first: only per-key order may hold then.
    function = KeyedFunction(keys, immediate=False)
    held = {position_of(e) for e in state}
    not_read = {position_of(e) for e in unread}
    # Emitted before the snapshot: completed for good.
    function.completed.update(p for p in keys if p not in held and p not in not_read)
    second = Harness(
        function, unread, mode=KEY, capacity=capacity, restored=state, key=key_of(keys)
    )

    async def newest_first(h: Harness) -> None:
        task = h.task
        assert task is not None
        while True:
            await h.wait_until(lambda: task.done() or (h.idle() and bool(function.pending)))
            if task.done():
                return
            value, future = function.pending.pop()
            future.complete(results_for(value))

    after = second.run(newest_first)
    assert function.violations == []
    combined = before + after
    check_output(combined, inputs, keys)

    def per_key(out: list[Element]) -> dict[int, list[int]]:
        found: dict[int, list[int]] = defaultdict(list)
        for e in out:
            if isinstance(e, StreamRecord):
                assert e.timestamp is not None
                found[keys[e.timestamp]].append(e.value)
        return dict(found)

    assert per_key(combined) == per_key(uninterrupted)


@PROPERTY
@given(
    kinds=st.lists(st.one_of(st.none(), st.integers(0, 2)), min_size=3, max_size=12),
    capacity=st.integers(1, 5),
    restored_capacity=st.integers(1, 5),
    data=st.data(),
)
def test_snapshot_and_restore_at_any_point_keep_key_order(
    kinds: list[int | None], capacity: int, restored_capacity: int, data: st.DataObject
) -> None:
    inputs, keys = keyed_inputs(kinds)
    first = Harness(
        KeyedFunction(keys, immediate=False),
        inputs,
        mode=KEY,
        capacity=capacity,
        hold_open=True,
        key=key_of(keys),
    )
    taken: list[tuple[list[Element], int, list[Element]]] = []

    async def run_prefix(h: Harness) -> None:
        await h.wait_until(h.idle)
        for _ in range(data.draw(st.integers(0, 6), label="rounds")):
            if not h.function.pending:
                break
            complete_some(h, data)
            await h.wait_until(h.idle)

        def snapshot() -> None:
            taken.append((h.operator.snapshot(), len(h.out), list(h.inputs)))

        h.processor.executor().execute(snapshot, "snapshot")
        await h.wait_until(lambda: bool(taken) and h.idle())
        h.processor.executor().execute(h.processor.all_actions_completed, "stop")

    first.run(run_prefix)
    state, emitted, unread = taken[0]
    second = Harness(
        KeyedFunction(keys, immediate=False),
        unread,
        mode=KEY,
        capacity=restored_capacity,
        restored=state,
        key=key_of(keys),
    )
    after = second.run(complete_randomly(data))
    check_output(first.out[:emitted] + after, inputs, keys)
