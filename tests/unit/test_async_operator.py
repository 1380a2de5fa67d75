"""AsyncWaitOperator driven by a real MailboxProcessor on an asyncio loop.

The async function only *stores* its ResultFutures; the test completes them in the order it
chooses (on the loop, or from another thread), so every run is deterministic.
"""

from __future__ import annotations

import asyncio
import threading
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spark_jobs.async_io import (
    AsyncFunction,
    AsyncWaitOperator,
    CoroutineAsyncFunction,
    Marker,
    Output,
    OutputMode,
    ResultFuture,
    StreamRecord,
    Watermark,
)
from spark_jobs.runtime import MailboxController, MailboxProcessor, WrongThreadError

TIMEOUT = 5.0
Element = StreamRecord[Any] | Marker


class ManualFunction(AsyncFunction[int, int]):
    """Keeps every (value, ResultFuture) until the test completes it."""

    def __init__(self) -> None:
        self.pending: list[tuple[int, ResultFuture[int]]] = []
        self.invoked: list[int] = []

    def async_invoke(self, value: int, result_future: ResultFuture[int]) -> None:
        self.invoked.append(value)
        self.pending.append((value, result_future))

    def take(self, value: int) -> ResultFuture[int]:
        for i, (v, future) in enumerate(self.pending):
            if v == value:
                del self.pending[i]
                return future
        raise AssertionError(f"no pending request for {value}")


class Harness:
    """A task: its default action feeds ``inputs`` into the operator with back-pressure.

    When the operator is full the default action suspends itself until a slot frees; at the
    end of input it suspends and ends the loop once everything in flight was emitted.
    """

    def __init__(
        self,
        function: AsyncFunction[int, int],
        inputs: list[Element],
        *,
        mode: OutputMode = OutputMode.ORDERED,
        capacity: int = 100,
    ) -> None:
        self.function = function
        self.inputs: deque[Element] = deque(inputs)
        self.out: list[Element] = []
        self.processor = MailboxProcessor(self._default_action, debug=True)
        output: Output[int] = Output(
            lambda value, ts: self.out.append(StreamRecord(value, ts)), self.out.append
        )
        self.operator: AsyncWaitOperator[int, int] = AsyncWaitOperator(
            function, output, self.processor, capacity=capacity, mode=mode
        )
        self.backpressured = 0
        self.task: asyncio.Future[None] | None = None

    def _default_action(self, controller: MailboxController) -> None:
        if not self.inputs:
            controller.suspend_default_action()
            self.operator.notify_when_drained(controller.all_actions_completed)
            return
        if not self.operator.has_capacity():
            self.backpressured += 1
            suspension = controller.suspend_default_action()
            self.operator.notify_when_available(suspension.resume)
            return
        element = self.inputs.popleft()
        if isinstance(element, Marker):
            self.operator.process_marker(element)
        else:
            self.operator.process_element(element.value, element.timestamp)

    def idle(self) -> bool:
        """The loop waits for completions: input suspended and no mail left to run."""
        return self.processor.is_default_action_suspended and not self.processor.mailbox.has_mail()

    async def wait_until(self, condition: Callable[[], bool]) -> None:
        """Yield to the loop (no real-time sleep) until ``condition``; fail fast if it died."""

        async def poll() -> None:
            while not condition():
                if self.task is not None and self.task.done():
                    self.task.result()  # re-raise the loop's failure
                    raise AssertionError("the mailbox loop ended before the condition held")
                await asyncio.sleep(0)

        await asyncio.wait_for(poll(), TIMEOUT)

    async def settle(self) -> None:
        """Wait until every posted mail ran and the input is waiting again."""
        await self.wait_until(self.idle)

    def run(self, driver: Callable[[Harness], Awaitable[None]]) -> list[Element]:
        async def main() -> None:
            await self.operator.open()
            self.task = asyncio.ensure_future(self.processor.run_loop())
            try:
                await asyncio.wait_for(driver(self), TIMEOUT)
                await asyncio.wait_for(self.task, TIMEOUT)
            finally:
                self.task.cancel()
                await self.operator.close()

        asyncio.run(main())
        return self.out


def rec(value: int, ts: int | None = None) -> StreamRecord[int]:
    return StreamRecord(value, value if ts is None else ts)


def doubled(value: int) -> list[int]:
    return [2 * value]


def complete_when_idle(
    pick: Callable[[list[tuple[int, ResultFuture[int]]]], int],
) -> Callable[[Harness], Awaitable[None]]:
    """Driver: whenever the loop waits, complete the pending request ``pick`` chooses."""

    async def drive(h: Harness) -> None:
        assert isinstance(h.function, ManualFunction)
        pending = h.function.pending
        task = h.task
        assert task is not None
        while True:
            # Idle with nothing in flight happens only at the very end: wait for the loop to end.
            await h.wait_until(lambda: task.done() or (h.idle() and bool(pending)))
            if task.done():
                return
            value, future = pending.pop(pick(pending))
            future.complete(doubled(value))

    return drive


FIFO = complete_when_idle(lambda pending: 0)
LIFO = complete_when_idle(lambda pending: len(pending) - 1)


# -- the Flink event-time scenario -----------------------------------------------------------

EVENT_TIME_INPUTS: list[Element] = [rec(1), rec(2), Watermark(timestamp=2), rec(3)]


@pytest.mark.parametrize("driver", [FIFO, LIFO], ids=["fifo", "lifo"])
def test_event_time_ordered(driver: Callable[[Harness], Awaitable[None]]) -> None:
    h = Harness(ManualFunction(), EVENT_TIME_INPUTS, mode=OutputMode.ORDERED, capacity=2)
    out = h.run(driver)
    assert out == [rec(2, 1), rec(4, 2), Watermark(timestamp=2), rec(6, 3)]
    assert h.backpressured >= 1  # capacity 2 held the watermark back at least once


@pytest.mark.parametrize("driver", [FIFO, LIFO], ids=["fifo", "lifo"])
def test_event_time_unordered(driver: Callable[[Harness], Awaitable[None]]) -> None:
    h = Harness(ManualFunction(), EVENT_TIME_INPUTS, mode=OutputMode.UNORDERED, capacity=2)
    out = h.run(driver)
    assert len(out) == 4
    w = out.index(Watermark(timestamp=2))
    assert set(map(repr, out[:w])) == {repr(rec(2, 1)), repr(rec(4, 2))}
    assert out[w + 1 :] == [rec(6, 3)]


def test_event_time_unordered_lifo_really_reorders_before_the_watermark() -> None:
    h = Harness(ManualFunction(), EVENT_TIME_INPUTS, mode=OutputMode.UNORDERED, capacity=2)
    assert h.run(LIFO) == [rec(4, 2), rec(2, 1), Watermark(timestamp=2), rec(6, 3)]


# -- output modes ----------------------------------------------------------------------------


def test_ordered_mode_emits_in_input_order() -> None:
    fn = ManualFunction()
    h = Harness(fn, [rec(v) for v in range(1, 6)], mode=OutputMode.ORDERED, capacity=10)

    async def drive(h: Harness) -> None:
        await h.wait_until(lambda: len(fn.pending) == 5 and h.idle())
        for value in (5, 3, 4, 2):
            fn.take(value).complete([10 * value])
        await h.settle()
        assert h.out == []  # record 1 holds everything back
        fn.take(1).complete([10])

    out = h.run(drive)
    assert out == [rec(10 * v, v) for v in range(1, 6)]
    assert fn.invoked == [1, 2, 3, 4, 5]
    assert (h.operator.records_in, h.operator.records_out) == (5, 5)


def test_unordered_mode_emits_in_completion_order() -> None:
    fn = ManualFunction()
    h = Harness(fn, [rec(1), rec(2), rec(3)], mode=OutputMode.UNORDERED, capacity=10)

    async def drive(h: Harness) -> None:
        await h.wait_until(lambda: len(fn.pending) == 3 and h.idle())
        fn.take(3).complete([30])
        await h.settle()
        assert h.out == [rec(30, 3)]  # left at once, without waiting for 1 and 2
        fn.take(1).complete([10])
        fn.take(2).complete([20, 21])

    assert h.run(drive) == [rec(30, 3), rec(10, 1), rec(20, 2), rec(21, 2)]


def test_completions_from_another_thread() -> None:
    fn = ManualFunction()
    h = Harness(fn, [rec(v) for v in range(1, 9)], mode=OutputMode.ORDERED, capacity=8)

    def complete_all_backwards() -> None:
        for value, future in reversed(list(fn.pending)):
            future.complete(doubled(value))

    async def drive(h: Harness) -> None:
        await h.wait_until(lambda: len(fn.pending) == 8 and h.idle())
        # Not joined here: the completions race with the loop parked in its selector.
        thread = threading.Thread(target=complete_all_backwards)
        thread.start()
        assert h.task is not None
        await asyncio.wait_for(asyncio.shield(h.task), TIMEOUT)
        thread.join(TIMEOUT)
        assert not thread.is_alive()

    assert h.run(drive) == [rec(2 * v, v) for v in range(1, 9)]


# -- back-pressure and notifications ---------------------------------------------------------


def test_capacity_back_pressure_and_notify_when_available() -> None:
    fn = ManualFunction()
    h = Harness(fn, [rec(v) for v in range(1, 5)], mode=OutputMode.ORDERED, capacity=2)
    notified: list[tuple[list[Element], bool]] = []

    async def drive(h: Harness) -> None:
        op = h.operator
        await h.wait_until(lambda: len(fn.pending) == 2 and h.idle())
        assert not op.has_capacity()
        assert op.in_flight() == 2
        assert fn.invoked == [1, 2]  # the input stopped at the capacity

        op.notify_when_available(
            lambda: notified.append((list(h.out), h.processor.is_mailbox_thread()))
        )
        fn.take(2).complete([20])
        await h.settle()
        assert notified == []  # record 2 is done but waits behind 1: still no free slot
        assert not op.has_capacity()

        fn.take(1).complete([10])
        await h.wait_until(lambda: len(notified) == 1)
        # Fired on the mailbox thread after the completion emitted 1 and 2.
        assert notified == [([rec(10, 1), rec(20, 2)], True)]

        await h.wait_until(lambda: len(fn.pending) == 2 and h.idle())
        assert fn.invoked == [1, 2, 3, 4]
        fn.take(3).complete([30])
        fn.take(4).complete([40])

    out = h.run(drive)
    assert out == [rec(10 * v, v) for v in range(1, 5)]
    assert len(notified) == 1


def test_notify_when_available_runs_at_once_when_there_is_room() -> None:
    fn = ManualFunction()
    h = Harness(fn, [], capacity=1)
    called: list[bool] = []
    h.operator.notify_when_available(lambda: called.append(True))
    assert called == [True]


def test_notify_when_drained() -> None:
    fn = ManualFunction()
    h = Harness(fn, [rec(1), rec(2)], mode=OutputMode.UNORDERED, capacity=10)
    drained: list[list[Element]] = []

    async def drive(h: Harness) -> None:
        op = h.operator
        await h.wait_until(lambda: len(fn.pending) == 2 and h.idle())
        op.notify_when_drained(lambda: drained.append(list(h.out)))
        fn.take(2).complete([20])
        await h.settle()
        assert drained == []
        fn.take(1).complete([10])
        await h.wait_until(lambda: bool(drained))

    h.run(drive)
    assert drained == [[rec(20, 2), rec(10, 1)]]
    immediately: list[bool] = []
    h.operator.notify_when_drained(lambda: immediately.append(True))
    assert immediately == [True]


# -- completion semantics --------------------------------------------------------------------


def test_only_the_first_completion_counts() -> None:
    fn = ManualFunction()
    h = Harness(fn, [rec(1), rec(2)], mode=OutputMode.ORDERED, capacity=10)

    async def drive(h: Harness) -> None:
        await h.wait_until(lambda: len(fn.pending) == 2 and h.idle())
        first = fn.take(1)
        first.complete([10])
        first.complete([11, 12])
        first.complete_exceptionally(RuntimeError("late failure must be ignored"))
        await h.settle()
        second = fn.take(2)
        second.complete([20])
        second.complete_exceptionally(RuntimeError("late failure must be ignored"))
        second.complete([21])

    assert h.run(drive) == [rec(10, 1), rec(20, 2)]
    assert h.operator.records_out == 2


class LookupFailedError(Exception):
    pass


def test_complete_exceptionally_fails_the_loop_at_once_and_keeps_the_element() -> None:
    """Flink's rule: an error fails the task at once. Nothing after it is emitted, and the
    failed element is never completed, so no snapshot can leave it out (issue 21, row 1: the
    old operator completed it empty and a checkpoint taken before the queue drained committed
    past it)."""
    fn = ManualFunction()
    h = Harness(fn, [rec(1), rec(2), rec(3)], mode=OutputMode.UNORDERED, capacity=2)
    error = LookupFailedError("lookup failed for 2")

    async def drive(h: Harness) -> None:
        await h.wait_until(lambda: len(fn.pending) == 2 and h.idle())
        fn.take(2).complete_exceptionally(error)
        await h.settle()  # the failure surfaces now, with element 1 still in flight

    with pytest.raises(LookupFailedError) as raised:
        h.run(drive)
    assert raised.value is error
    assert h.out == []  # the failed element emits nothing, nor does anything after it
    assert fn.invoked == [1, 2]  # record 3 was never invoked
    assert not h.operator.has_capacity()  # a failed operator takes no more input
    with pytest.raises(LookupFailedError):  # the operator stays failed
        h.operator.process_element(3, 3)
    with pytest.raises(LookupFailedError):  # and never acknowledges a snapshot
        h.operator.snapshot()
    assert [e.value for e in h.operator._queue.values()] == [1, 2]  # the inputs are kept


def test_operator_methods_check_the_mailbox_thread_in_debug_mode() -> None:
    fn = ManualFunction()
    h = Harness(fn, [rec(1)], capacity=10)
    errors: list[BaseException] = []

    def from_elsewhere() -> None:
        try:
            h.operator.process_element(5, 5)
        except WrongThreadError as e:
            errors.append(e)

    async def drive(h: Harness) -> None:
        await h.wait_until(lambda: len(fn.pending) == 1 and h.idle())
        thread = threading.Thread(target=from_elsewhere)
        thread.start()
        thread.join(TIMEOUT)
        fn.take(1).complete([1])

    assert h.run(drive) == [rec(1, 1)]
    assert len(errors) == 1
    assert fn.invoked == [1]


# -- snapshot --------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", [OutputMode.ORDERED, OutputMode.UNORDERED])
def test_snapshot_holds_unemitted_inputs_in_input_order(mode: OutputMode) -> None:
    fn = ManualFunction()
    w = Watermark(timestamp=2)
    h = Harness(fn, [rec(1), rec(2), w, rec(3)], mode=mode, capacity=10)
    snapshots: list[list[Element]] = []

    async def snapshot_now(h: Harness) -> None:
        h.processor.executor().execute(lambda: snapshots.append(h.operator.snapshot()), "snap")
        await h.settle()

    async def drive(h: Harness) -> None:
        await h.wait_until(lambda: len(fn.pending) == 3 and h.idle())
        await snapshot_now(h)
        fn.take(3).complete([30])  # completed, but blocked (behind 1 and 2 / the watermark)
        await snapshot_now(h)
        fn.take(2).complete([20])
        await snapshot_now(h)
        fn.take(1).complete([10])
        await snapshot_now(h)

    out = h.run(drive)
    everything = [rec(1), rec(2), w, rec(3)]
    if mode is OutputMode.ORDERED:
        assert snapshots == [everything, everything, everything, []]
        assert out == [rec(10, 1), rec(20, 2), w, rec(30, 3)]
    else:
        assert snapshots == [everything, everything, [rec(1), w, rec(3)], []]
        assert out == [rec(20, 2), rec(10, 1), w, rec(30, 3)]


# -- coroutine style -------------------------------------------------------------------------


class GatedLookup(CoroutineAsyncFunction[int, int]):
    """``async def invoke`` that finishes only when the test opens the value's gate."""

    def __init__(self) -> None:
        self.gates: dict[int, asyncio.Event] = {}
        self.fail: set[int] = set()

    async def invoke(self, value: int) -> list[int]:
        gate = self.gates.setdefault(value, asyncio.Event())
        await gate.wait()
        if value in self.fail:
            raise LookupFailedError(f"no row for {value}")
        return [value * 100]

    def release(self, value: int) -> None:
        self.gates.setdefault(value, asyncio.Event()).set()


@pytest.mark.parametrize("mode", [OutputMode.ORDERED, OutputMode.UNORDERED])
def test_coroutine_async_function(mode: OutputMode) -> None:
    fn = GatedLookup()
    h = Harness(fn, [rec(1), rec(2), rec(3)], mode=mode, capacity=10)

    async def drive(h: Harness) -> None:
        await h.wait_until(lambda: len(fn.gates) == 3 and h.idle())
        for done, value in enumerate((3, 1, 2), start=1):
            fn.release(value)
            await h.wait_until(lambda done=done: h.operator.records_out == done)

    out = h.run(drive)
    if mode is OutputMode.ORDERED:
        assert out == [rec(100, 1), rec(200, 2), rec(300, 3)]
    else:
        assert out == [rec(300, 3), rec(100, 1), rec(200, 2)]


def test_coroutine_async_function_failure_fails_the_loop() -> None:
    fn = GatedLookup()
    fn.fail.add(2)
    h = Harness(fn, [rec(1), rec(2)], capacity=10)

    async def drive(h: Harness) -> None:
        await h.wait_until(lambda: len(fn.gates) == 2 and h.idle())
        fn.release(1)
        await h.wait_until(lambda: h.operator.records_out == 1)
        fn.release(2)
        assert h.task is not None
        await asyncio.wait_for(asyncio.shield(h.task), TIMEOUT)

    with pytest.raises(LookupFailedError, match="no row for 2"):
        h.run(drive)
    assert h.out == [rec(100, 1)]


# -- random schedules ------------------------------------------------------------------------


@settings(database=None, deadline=None, max_examples=60)
@given(
    kinds=st.lists(st.booleans(), max_size=12),
    capacity=st.integers(1, 4),
    ordered=st.booleans(),
    data=st.data(),
)
def test_random_completion_orders(
    kinds: list[bool], capacity: int, ordered: bool, data: st.DataObject
) -> None:
    inputs: list[Element] = [
        Watermark(timestamp=i) if is_marker else rec(i) for i, is_marker in enumerate(kinds)
    ]
    mode = OutputMode.ORDERED if ordered else OutputMode.UNORDERED
    h = Harness(ManualFunction(), inputs, mode=mode, capacity=capacity)
    picker = complete_when_idle(
        lambda pending: data.draw(st.integers(0, len(pending) - 1), label="complete")
    )
    out = h.run(picker)
    expected = [rec(2 * e.value, e.value) if isinstance(e, StreamRecord) else e for e in inputs]
    if ordered:
        assert out == expected
        return
    assert sorted(map(repr, out)) == sorted(map(repr, expected))
    for i, element in enumerate(expected):
        if isinstance(element, Marker):
            at = out.index(element)
            assert sorted(map(repr, out[:at])) == sorted(map(repr, expected[:i]))
