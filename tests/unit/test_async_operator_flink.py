"""Scenarios of Flink's AsyncWaitOperatorTest, ported to the Sluice mailbox.

Every test runs a real MailboxProcessor on an asyncio loop. Time is virtual: timeouts and
retry delays run on a ManualTimerService that moves only when the test calls ``advance``.
Async functions either complete at once (inside ``async_invoke``) or keep their ResultFutures
for the test to complete in the order it chooses, so every run is deterministic. Every wait
is bounded by ``asyncio.wait_for``.
"""

from __future__ import annotations

import asyncio
from collections import Counter, deque
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from spark_jobs.async_io import (
    EMPTY_RESULT,
    HAS_EXCEPTION,
    NO_RETRY,
    AsyncFunction,
    AsyncRetryStrategy,
    AsyncTimeoutError,
    AsyncWaitOperator,
    Marker,
    Output,
    OutputMode,
    ResultFuture,
    StreamRecord,
    Watermark,
    exponential_backoff,
    fixed_delay,
)
from spark_jobs.runtime import (
    MAX_PRIORITY,
    MailboxController,
    MailboxProcessor,
    ManualTimerService,
)

TIMEOUT = 5.0
Element = StreamRecord[Any] | Marker
Answer = list[int] | BaseException | None
ORDERED, UNORDERED = OutputMode.ORDERED, OutputMode.UNORDERED


def rec(value: int, ts: int | None = None) -> StreamRecord[int]:
    """A record whose timestamp defaults to its value (as in Flink's tests)."""
    return StreamRecord(value, value if ts is None else ts)


class MyError(Exception):
    """A user function failure."""


class ScriptedFunction(AsyncFunction[int, int]):
    """``respond(value, call_number)`` decides each call: a list completes the future at once,
    an exception fails it at once, None keeps it in ``pending`` for the test to complete.
    ``on_timeout`` (if given) completes a timed-out input with its result instead of failing,
    or, when it returns None, keeps that future in ``timeout_pending`` for the test.
    """

    def __init__(
        self,
        respond: Callable[[int, int], Answer] | None = None,
        on_timeout: Callable[[int], list[int] | None] | None = None,
    ) -> None:
        self.respond: Callable[[int, int], Answer] = respond or (lambda _v, _n: None)
        self.on_timeout = on_timeout
        self.pending: list[tuple[int, ResultFuture[int]]] = []
        self.invoked: list[int] = []
        self.timed_out: list[int] = []
        self.timeout_pending: list[tuple[int, ResultFuture[int]]] = []

    def async_invoke(self, value: int, result_future: ResultFuture[int]) -> None:
        self.invoked.append(value)
        answer = self.respond(value, self.invoked.count(value))
        if answer is None:
            self.pending.append((value, result_future))
        elif isinstance(answer, BaseException):
            result_future.complete_exceptionally(answer)
        else:
            result_future.complete(answer)

    def timeout(self, value: int, result_future: ResultFuture[int]) -> None:
        self.timed_out.append(value)
        if self.on_timeout is None:
            super().timeout(value, result_future)
        elif (results := self.on_timeout(value)) is None:
            self.timeout_pending.append((value, result_future))
        else:
            result_future.complete(results)

    def pending_values(self) -> list[int]:
        return [v for v, _ in self.pending]

    def take(self, value: int) -> ResultFuture[int]:
        for i, (v, future) in enumerate(self.pending):
            if v == value:
                del self.pending[i]
                return future
        raise AssertionError(f"no pending request for {value}")


def doubling() -> ScriptedFunction:
    return ScriptedFunction(lambda v, _n: [2 * v])


class Task:
    """The loop of one task (a MailboxProcessor) with a virtual clock, run by a test driver."""

    def __init__(self) -> None:
        self.processor = MailboxProcessor(self._default_action, debug=True)
        self.timers = ManualTimerService()
        self.timers.bind(self.processor.executor())
        self.task: asyncio.Future[None] | None = None

    def _default_action(self, controller: MailboxController) -> None:
        raise NotImplementedError

    def operators(self) -> list[AsyncWaitOperator[int, int]]:
        raise NotImplementedError

    def idle(self) -> bool:
        """The loop waits: input suspended and no mail left to run."""
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
        await self.wait_until(self.idle)

    async def advance(self, seconds: float) -> None:
        """Move the virtual clock; due timers run as mails before this returns."""
        self.timers.advance(seconds)
        await self.settle()

    async def in_mail(self, action: Callable[[], object]) -> None:
        """Run ``action`` as a (checkpoint-priority) mail and wait until the loop is idle."""
        self.processor.executor(MAX_PRIORITY).execute(action, "test action")
        await self.settle()

    async def snapshot(self, operator: AsyncWaitOperator[int, int]) -> list[Element]:
        taken: list[list[Element]] = []
        await self.in_mail(lambda: taken.append(operator.snapshot()))
        assert len(taken) == 1
        return taken[0]

    def stop(self) -> None:
        """End the loop now, whatever is still in flight (task cancelled / restarted)."""
        self.processor.executor(MAX_PRIORITY).execute(self.processor.all_actions_completed, "stop")

    async def wait_for_end(self) -> None:
        assert self.task is not None
        await asyncio.wait_for(asyncio.shield(self.task), TIMEOUT)

    def run(self, driver: Callable[[Any], Awaitable[None]] | None = None) -> None:
        async def main() -> None:
            for operator in self.operators():
                await operator.open()
            self.task = asyncio.ensure_future(self.processor.run_loop())
            try:
                if driver is not None:
                    await asyncio.wait_for(driver(self), TIMEOUT)
                await asyncio.wait_for(self.task, TIMEOUT)
            finally:
                self.task.cancel()
                for operator in self.operators():
                    await operator.close()

        asyncio.run(main())


class Harness(Task):
    """One async operator; the default action feeds ``inputs`` with back-pressure.

    ``restored`` elements are handed to ``restore()`` by the first default-action call, before
    any new input. At the end of input the loop ends once the operator drained, unless
    ``hold_open`` (then the driver ends it with ``finish()`` or ``stop()``).
    """

    def __init__(
        self,
        function: ScriptedFunction,
        inputs: list[Element],
        *,
        mode: OutputMode = ORDERED,
        capacity: int = 100,
        timeout: float | None = None,
        retry: AsyncRetryStrategy = NO_RETRY,
        restored: list[Element] | None = None,
        hold_open: bool = False,
    ) -> None:
        super().__init__()
        self.function = function
        self.inputs: deque[Element] = deque(inputs)
        self.restored = restored
        self.hold_open = hold_open
        self.out: list[Element] = []
        output: Output[int] = Output(
            lambda value, ts: self.out.append(StreamRecord(value, ts)), self.out.append
        )
        self.operator: AsyncWaitOperator[int, int] = AsyncWaitOperator(
            function,
            output,
            self.processor,
            capacity=capacity,
            mode=mode,
            timeout=timeout,
            retry=retry,
            timer_service=self.timers,
        )
        self.backpressured = 0

    def operators(self) -> list[AsyncWaitOperator[int, int]]:
        return [self.operator]

    def _default_action(self, controller: MailboxController) -> None:
        if self.restored is not None:
            restored, self.restored = self.restored, None
            self.operator.restore(restored)
            return
        if not self.inputs:
            controller.suspend_default_action()
            if not self.hold_open:
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

    def finish(self) -> None:
        """End of input for a ``hold_open`` harness: end the loop once everything drained."""
        self.processor.executor().execute(
            lambda: self.operator.notify_when_drained(self.processor.all_actions_completed),
            "end of input",
        )

    async def complete(self, value: int, results: list[int]) -> None:
        """Wait until ``value`` is pending and the loop idles, then complete it."""
        await self.wait_until(lambda: value in self.function.pending_values() and self.idle())
        self.function.take(value).complete(results)
        await self.settle()


# -- event time (Flink: testEventTimeOrdered / testEventTimeUnordered) -----------------------

EVENT_TIME_INPUTS: list[Element] = [rec(1), rec(2), Watermark(timestamp=2), rec(3)]


def test_event_time_ordered() -> None:
    h = Harness(doubling(), EVENT_TIME_INPUTS, mode=ORDERED, capacity=2)
    h.run()
    assert h.out == [rec(2, 1), rec(4, 2), Watermark(timestamp=2), rec(6, 3)]


def test_event_time_unordered() -> None:
    h = Harness(doubling(), EVENT_TIME_INPUTS, mode=UNORDERED, capacity=2)
    h.run()
    assert len(h.out) == 4
    assert h.out[2] == Watermark(timestamp=2)
    assert h.out[3] == rec(6, 3)
    assert sorted(map(repr, h.out[:2])) == sorted(map(repr, [rec(2, 1), rec(4, 2)]))


# -- processing time (Flink: testProcessingTimeOrdered / testProcessingTimeUnordered) --------

SCRAMBLED = [3, 1, 6, 2, 5, 4, 8, 7]


async def complete_scrambled(h: Harness) -> None:
    for value in SCRAMBLED:
        await h.complete(value, [2 * value])


def test_processing_time_ordered() -> None:
    h = Harness(ScriptedFunction(), [rec(v) for v in range(1, 9)], mode=ORDERED, capacity=6)
    h.run(complete_scrambled)
    assert h.out == [rec(2 * v, v) for v in range(1, 9)]
    assert h.function.invoked == list(range(1, 9))
    assert h.backpressured >= 1  # 8 inputs, 6 slots


def test_processing_time_unordered() -> None:
    h = Harness(ScriptedFunction(), [rec(v) for v in range(1, 9)], mode=UNORDERED, capacity=6)
    h.run(complete_scrambled)
    assert sorted(map(repr, h.out)) == sorted(repr(rec(2 * v, v)) for v in range(1, 9))
    # Without watermarks a record leaves as soon as it completes: completion order.
    assert h.out == [rec(2 * v, v) for v in SCRAMBLED]
    assert h.backpressured >= 1


# -- operator chain (Flink: testOperatorChainWithProcessingTime) -----------------------------


class Chain(Task):
    """ordered async (x -> 2x, capacity 6) -> map (+1) -> unordered async (y -> 3y, capacity 3),
    one mailbox. The default action feeds the head only while *both* operators have room."""

    def __init__(self, inputs: list[Element]) -> None:
        super().__init__()
        self.inputs: deque[Element] = deque(inputs)
        self.out: list[Element] = []
        self.first_fn = ScriptedFunction()
        self.second_fn = ScriptedFunction()
        sink: Output[int] = Output(
            lambda value, ts: self.out.append(StreamRecord(value, ts)), self.out.append
        )
        self.second: AsyncWaitOperator[int, int] = AsyncWaitOperator(
            self.second_fn, sink, self.processor, capacity=3, mode=UNORDERED
        )
        mapped: Output[int] = Output(
            lambda value, ts: self.second.process_element(value + 1, ts),
            self.second.process_marker,
        )
        self.first: AsyncWaitOperator[int, int] = AsyncWaitOperator(
            self.first_fn, mapped, self.processor, capacity=6, mode=ORDERED
        )
        self.max_second_in_flight = 0
        self.fed_while_full: list[int] = []

    def operators(self) -> list[AsyncWaitOperator[int, int]]:
        return [self.first, self.second]

    def _default_action(self, controller: MailboxController) -> None:
        first, second = self.first, self.second
        if not self.inputs:
            controller.suspend_default_action()
            first.notify_when_drained(
                lambda: second.notify_when_drained(controller.all_actions_completed)
            )
            return
        if not (first.has_capacity() and second.has_capacity()):
            suspension = controller.suspend_default_action()
            for operator in (first, second):
                if not operator.has_capacity():
                    operator.notify_when_available(suspension.resume)
            return
        element = self.inputs.popleft()
        assert isinstance(element, StreamRecord)
        first.process_element(element.value, element.timestamp)


def test_operator_chain_with_processing_time() -> None:
    chain = Chain([rec(v) for v in range(1, 9)])

    async def drive(c: Task) -> None:
        assert isinstance(c, Chain)
        task = c.task
        assert task is not None
        first, second = c.first_fn.pending, c.second_fn.pending
        while True:
            await c.wait_until(lambda: task.done() or (c.idle() and bool(first or second)))
            if task.done():
                return
            # The input is suspended: some operator of the chain must be out of room.
            if c.inputs:
                assert not (c.first.has_capacity() and c.second.has_capacity())
            c.max_second_in_flight = max(c.max_second_in_flight, c.second.in_flight())
            if first:  # scrambled: always the middle request of the head operator
                value, future = first.pop(len(first) // 2)
                future.complete([2 * value])
            else:  # newest first
                value, future = second.pop()
                future.complete([3 * value])

    chain.run(drive)
    expected = [rec(3 * (2 * v + 1), v) for v in range(1, 9)]
    assert sorted(map(repr, chain.out)) == sorted(map(repr, expected))
    assert len(chain.out) == 8
    assert chain.first_fn.invoked == list(range(1, 9))
    assert sorted(chain.second_fn.invoked) == [2 * v + 1 for v in range(1, 9)]
    assert chain.max_second_in_flight > 3  # the second operator really back-logged
    assert chain.first.in_flight() == chain.second.in_flight() == 0


# -- snapshot / restore (Flink: testStateSnapshotAndRestore, testRestartWithFullQueue) -------


def test_snapshot_and_restore_onto_a_different_function() -> None:
    first = Harness(ScriptedFunction(), [rec(v) for v in range(1, 5)], hold_open=True)
    snapshots: list[list[Element]] = []

    async def take_snapshot(h: Harness) -> None:
        await h.wait_until(lambda: len(h.function.pending) == 4 and h.idle())
        snapshots.append(await h.snapshot(h.operator))
        h.stop()

    first.run(take_snapshot)
    assert first.out == []
    assert snapshots == [[rec(1), rec(2), rec(3), rec(4)]]

    second = Harness(doubling(), [], restored=snapshots[0])
    second.run()
    assert second.out == [rec(2, 1), rec(4, 2), rec(6, 3), rec(8, 4)]
    assert second.function.invoked == [1, 2, 3, 4]


def test_restart_with_full_queue() -> None:
    first = Harness(ScriptedFunction(), [rec(v) for v in range(1, 11)], capacity=10)
    first.hold_open = True
    snapshots: list[list[Element]] = []

    async def take_snapshot(h: Harness) -> None:
        await h.wait_until(lambda: len(h.function.pending) == 10 and h.idle())
        assert not h.operator.has_capacity()
        snapshots.append(await h.snapshot(h.operator))
        h.stop()

    first.run(take_snapshot)
    assert first.out == []
    assert snapshots == [[rec(v) for v in range(1, 11)]]

    second = Harness(
        doubling(), [rec(v) for v in range(11, 21)], capacity=10, restored=snapshots[0]
    )
    second.run()
    assert second.out == [rec(2 * v, v) for v in range(1, 21)]
    assert second.function.invoked == list(range(1, 21))


# -- timeouts (Flink: testAsyncTimeoutFailure, testAsyncTimeoutIgnore, testTimeoutCleanup,
#    testTimeoutAfterComplete) ---------------------------------------------------------------


def test_timeout_fails_the_task_once_drained() -> None:
    fn = ScriptedFunction()
    h = Harness(fn, [rec(1)], timeout=1.0)

    async def drive(h: Harness) -> None:
        await h.wait_until(lambda: len(fn.pending) == 1 and h.idle())
        await h.advance(0.5)
        assert fn.timed_out == []
        await h.advance(0.5)  # the deadline: timeout() fails the element

    with pytest.raises(AsyncTimeoutError):
        h.run(drive)
    assert fn.timed_out == [1]
    assert h.out == []


def test_timeout_handled_by_the_timeout_function() -> None:
    fn = ScriptedFunction(on_timeout=lambda v: [3 * v])
    h = Harness(fn, [rec(1), rec(2)], timeout=1.0)

    async def drive(h: Harness) -> None:
        await h.wait_until(lambda: len(fn.pending) == 2 and h.idle())
        await h.advance(0.999)
        assert h.out == []
        await h.advance(0.001)

    h.run(drive)  # no error
    assert h.out == [rec(3, 1), rec(6, 2)]
    assert fn.timed_out == [1, 2]
    assert h.operator.timeouts == 2
    assert h.operator.pending_timers() == h.timers.pending() == 0


def test_timeout_timers_are_cleaned_up_after_completion() -> None:
    fn = ScriptedFunction()
    h = Harness(fn, [rec(1), rec(2), rec(3)], timeout=1.0, hold_open=True)
    pending_while_in_flight: list[int] = []

    async def drive(h: Harness) -> None:
        await h.wait_until(lambda: len(fn.pending) == 3 and h.idle())
        pending_while_in_flight.append(h.operator.pending_timers())
        await h.advance(0.25)
        await h.complete(2, [20])
        await h.advance(0.25)
        await h.complete(3, [30])
        pending_while_in_flight.append(h.operator.pending_timers())
        await h.complete(1, [10])
        assert h.out == [rec(10, 1), rec(20, 2), rec(30, 3)]
        assert h.operator.pending_timers() == 0
        assert h.timers.pending() == 0
        await h.advance(5.0)  # nothing left to fire
        assert fn.timed_out == []
        h.finish()

    h.run(drive)
    assert all(n >= 1 for n in pending_while_in_flight)
    assert h.operator.pending_timers() == h.timers.pending() == 0
    assert fn.timed_out == []


@pytest.mark.parametrize("completed_at", [0.0, 0.9])
def test_result_before_timeout_never_calls_timeout(completed_at: float) -> None:
    fn = ScriptedFunction(on_timeout=lambda v: [-v])
    h = Harness(fn, [rec(1)], timeout=1.0, hold_open=True)

    async def drive(h: Harness) -> None:
        await h.wait_until(lambda: len(fn.pending) == 1 and h.idle())
        if completed_at:
            await h.advance(completed_at)
        await h.complete(1, [2])
        assert h.out == [rec(2, 1)]
        await h.advance(2.0)  # well past the deadline, the loop still running
        h.finish()

    h.run(drive)
    assert fn.timed_out == []
    assert h.out == [rec(2, 1)]
    assert h.operator.timeouts == 0
    assert h.operator.pending_timers() == 0


# -- user exceptions and retries (Flink: testUserExceptionHandling, testProcessingTimeWith*
#    Retry*) ---------------------------------------------------------------------------------


def test_user_exception_fails_the_task_at_once() -> None:
    """Flink fails the task as soon as an element completes exceptionally (failExternally):
    no result of anything still in flight reaches the output, and no checkpoint can be
    acknowledged afterwards."""
    fn = ScriptedFunction()
    h = Harness(fn, [rec(1), rec(2), rec(3)], capacity=10)
    error = MyError("lookup failed for 2")

    async def drive(h: Harness) -> None:
        await h.wait_until(lambda: len(fn.pending) == 3 and h.idle())
        fn.take(2).complete_exceptionally(error)
        await h.settle()  # the task dies here: 1 and 3 are still in flight
        fn.take(1).complete([10])

    with pytest.raises(MyError) as raised:
        h.run(drive)
    assert raised.value is error
    assert h.out == []  # nothing emitted after the failure
    assert [e.value for e in h.operator._queue.values()] == [1, 2, 3]


def test_user_exception_retried_until_success() -> None:
    fn = ScriptedFunction(lambda v, n: MyError(f"attempt {n}") if n <= 2 else [2 * v])
    retry = fixed_delay(2, 0.5, on_exception=HAS_EXCEPTION)
    h = Harness(fn, [rec(1)], timeout=10.0, retry=retry, hold_open=True)

    async def drive(h: Harness) -> None:
        await h.settle()
        assert fn.invoked == [1]
        await h.advance(0.4)
        assert fn.invoked == [1]  # the retry waits for its delay
        await h.advance(0.1)
        assert fn.invoked == [1, 1]
        await h.advance(0.5)
        assert fn.invoked == [1, 1, 1]
        assert h.out == [rec(2, 1)]
        h.finish()

    h.run(drive)  # no error
    assert h.out == [rec(2, 1)]
    assert fn.invoked == [1, 1, 1]
    assert h.operator.retries == 2
    assert h.operator.pending_timers() == 0


def test_user_exception_after_the_last_retry_fails_the_task() -> None:
    fn = ScriptedFunction(lambda _v, n: MyError(f"attempt {n}"))
    retry = fixed_delay(2, 0.5, on_exception=HAS_EXCEPTION)
    h = Harness(fn, [rec(1)], timeout=10.0, retry=retry)

    async def drive(h: Harness) -> None:
        await h.settle()
        await h.advance(0.5)
        assert fn.invoked == [1, 1]
        await h.advance(0.5)

    with pytest.raises(MyError, match="attempt 3"):
        h.run(drive)
    assert fn.invoked == [1, 1, 1]
    assert h.out == []


def odd_empty(value: int, _call: int) -> list[int]:
    return [] if value % 2 else [2 * value]


@pytest.mark.parametrize("mode", [ORDERED, UNORDERED])
@pytest.mark.parametrize(
    "retry",
    [
        fixed_delay(2, 0.1, on_result=EMPTY_RESULT),
        exponential_backoff(2, 0.1, 1.0, 2.0, on_result=EMPTY_RESULT),
    ],
    ids=["fixed_delay", "exponential_backoff"],
)
def test_retry_on_empty_result(retry: AsyncRetryStrategy, mode: OutputMode) -> None:
    fn = ScriptedFunction(odd_empty)
    h = Harness(fn, [rec(v) for v in range(1, 7)], mode=mode, timeout=10.0, retry=retry)

    async def drive(h: Harness) -> None:
        assert h.task is not None
        for _ in range(50):
            await h.settle()
            if h.task.done():
                return
            await h.advance(0.1)
        raise AssertionError("the retries never finished")

    h.run(drive)
    assert h.out == [rec(4, 2), rec(8, 4), rec(12, 6)]
    assert Counter(fn.invoked) == {1: 3, 2: 1, 3: 3, 4: 1, 5: 3, 6: 1}
    assert h.operator.retries == 6
    assert h.operator.timeouts == 0
    assert h.operator.pending_timers() == 0


def test_exponential_backoff_waits_longer_each_retry() -> None:
    fn = ScriptedFunction(lambda _v, _n: [])
    retry = exponential_backoff(2, 0.1, 1.0, 2.0, on_result=EMPTY_RESULT)
    h = Harness(fn, [rec(1)], timeout=10.0, retry=retry)

    async def drive(h: Harness) -> None:
        await h.settle()
        assert fn.invoked == [1]
        await h.advance(0.1)
        assert fn.invoked == [1, 1]
        await h.advance(0.1)
        assert fn.invoked == [1, 1]  # the second retry waits 0.2
        await h.advance(0.1)

    h.run(drive)
    assert fn.invoked == [1, 1, 1]
    assert h.out == []  # the last attempt's empty result stands


@pytest.mark.parametrize("deferred", [False, True], ids=["at_once", "deferred"])
def test_retry_ends_in_timeout_function(deferred: bool) -> None:
    """The timeout spans all attempts; once it fired no retry runs, even while the
    ``timeout()`` result is still outstanding (``deferred``)."""
    fn = ScriptedFunction(lambda _v, _n: [], on_timeout=lambda v: None if deferred else [-v])
    retry = fixed_delay(100, 1.0, on_result=EMPTY_RESULT)
    h = Harness(fn, [rec(1, 10), rec(2, 20)], timeout=3.5, retry=retry, hold_open=True)
    calls_at_timeout: list[int] = []

    async def drive(h: Harness) -> None:
        await h.settle()
        for _ in range(6):  # t = 0.5 .. 3.0: retries at 1, 2, 3
            await h.advance(0.5)
            assert h.out == []
            assert fn.timed_out == []
        await h.advance(0.5)  # t = 3.5: the deadline
        assert fn.timed_out == [1, 2]
        calls_at_timeout.append(len(fn.invoked))
        for _ in range(10):  # the retry due at t = 4 must never run
            await h.advance(0.5)
        assert len(fn.invoked) == calls_at_timeout[0]
        if deferred:
            assert h.out == []
            for value, future in fn.timeout_pending:
                future.complete([-value])
            await h.settle()
        assert h.out == [rec(-1, 10), rec(-2, 20)]
        h.finish()

    h.run(drive)
    assert Counter(fn.invoked) == {1: 4, 2: 4}  # t = 0, 1, 2, 3
    assert h.out == [rec(-1, 10), rec(-2, 20)]
    assert h.operator.timeouts == 2
    assert h.operator.pending_timers() == 0


# -- drain (Flink: testIgnoreAsyncOperatorRecordsOnDrain) ------------------------------------


def test_results_arriving_after_close_are_dropped() -> None:
    fn = ScriptedFunction()
    h = Harness(fn, [rec(1), rec(2), rec(3)], hold_open=True)

    async def drive(h: Harness) -> None:
        await h.wait_until(lambda: len(fn.pending) == 3 and h.idle())
        fn.take(3).complete([30])  # completed but held behind 1 and 2
        await h.settle()
        assert h.out == []
        await h.operator.close()  # finishing: the rest is dropped (restored from state)
        fn.take(1).complete([10])
        fn.take(2).complete_exceptionally(MyError("late failure must be ignored"))
        await h.settle()
        assert h.out == []
        h.stop()

    h.run(drive)  # no error
    assert h.out == []


def test_close_cancels_every_timer() -> None:
    """``close()`` cancels the timeout timer and the pending retry timers alike."""
    fn = ScriptedFunction(lambda _v, _n: [])
    retry = fixed_delay(3, 1.0, on_result=EMPTY_RESULT)
    h = Harness(fn, [rec(1)], timeout=10.0, retry=retry, hold_open=True)
    timers_after_close: list[int] = []

    async def drive(h: Harness) -> None:
        await h.settle()
        assert h.operator.pending_timers() == 2  # the deadline and the retry due at t = 1
        await h.operator.close()
        timers_after_close.append(h.operator.pending_timers())
        await h.advance(2.0)
        assert fn.invoked == [1]  # no retry after close
        h.stop()

    h.run(drive)
    assert fn.invoked == [1]
    assert h.out == []
    assert timers_after_close == [0]
    assert h.timers.pending() == 0


def test_late_result_after_the_task_ended_does_not_raise() -> None:
    fn = ScriptedFunction()
    h = Harness(fn, [rec(1), rec(2)], hold_open=True)

    async def drive(h: Harness) -> None:
        await h.wait_until(lambda: len(fn.pending) == 2 and h.idle())
        h.stop()

    h.run(drive)  # the loop ended and the operator was closed with 1 and 2 in flight
    fn.take(1).complete([10])
    fn.take(2).complete_exceptionally(MyError("late failure must be ignored"))
    assert h.out == []


# -- configuration ---------------------------------------------------------------------------


@pytest.mark.parametrize("timeout", [None, 0.0, -1.0])
def test_retry_requires_a_timeout(timeout: float | None) -> None:
    processor = MailboxProcessor(lambda _controller: None)
    output: Output[int] = Output(lambda _value, _ts: None, lambda _marker: None)
    with pytest.raises(ValueError, match="timeout"):
        AsyncWaitOperator(
            ScriptedFunction(),
            output,
            processor,
            timeout=timeout,
            retry=fixed_delay(3, 0.1, on_result=EMPTY_RESULT),
        )
