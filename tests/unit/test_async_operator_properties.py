"""Properties of AsyncWaitOperator under random completion orders (Hypothesis).

A real MailboxProcessor runs on an asyncio loop; the async function keeps its ResultFutures
and the test completes them in an order Hypothesis draws (a batch at a time, so several
completions may share one mail). Examples are derandomized and bounded so the file stays fast.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from spark_jobs.async_io import (
    AsyncFunction,
    AsyncWaitOperator,
    Marker,
    Output,
    OutputMode,
    ResultFuture,
    StreamRecord,
    Watermark,
)
from spark_jobs.runtime import (
    DEFAULT_PRIORITY,
    MAX_PRIORITY,
    MailboxController,
    MailboxProcessor,
)

TIMEOUT = 5.0
Element = StreamRecord[Any] | Marker
ORDERED, UNORDERED = OutputMode.ORDERED, OutputMode.UNORDERED
PROPERTY = settings(derandomize=True, database=None, deadline=None, max_examples=100)


def results_for(value: int) -> list[int]:
    """0, 1 or 2 results per input, so empty and multi-result completions both occur."""
    return [10 * value + i for i in range(value % 3)]


def make_inputs(kinds: list[bool]) -> list[Element]:
    """``True`` is a watermark, ``False`` a record; values/timestamps are the positions."""
    return [
        Watermark(timestamp=i) if is_wm else StreamRecord(i, i) for i, is_wm in enumerate(kinds)
    ]


def expected_output(inputs: list[Element]) -> list[Element]:
    out: list[Element] = []
    for element in inputs:
        if isinstance(element, StreamRecord):
            out.extend(StreamRecord(r, element.timestamp) for r in results_for(element.value))
        else:
            out.append(element)
    return out


def position(element: Element) -> int:
    """The input position of an input element (record value, watermark timestamp)."""
    if isinstance(element, StreamRecord):
        assert isinstance(element.value, int)
        return element.value
    assert isinstance(element, Watermark)
    return element.timestamp


def as_multiset(elements: list[Element]) -> list[str]:
    return sorted(map(repr, elements))


def assert_no_record_crosses_a_watermark(out: list[Element]) -> None:
    """Every record leaves between the same two watermarks it entered between: exactly the
    watermarks that preceded it in the input were emitted before it (values and watermark
    timestamps are input positions, so the input order is recoverable from the output)."""
    watermarks = [e.timestamp for e in out if isinstance(e, Watermark)]
    assert watermarks == sorted(watermarks)
    emitted = 0
    for element in out:
        if isinstance(element, Watermark):
            emitted += 1
            continue
        assert isinstance(element, StreamRecord)
        position = element.timestamp
        assert position is not None
        assert emitted == sum(1 for w in watermarks if w < position), (element, out)


class Function(AsyncFunction[int, int]):
    """Completes at once with ``results_for`` (``immediate``) or keeps the future pending."""

    def __init__(self, *, immediate: bool) -> None:
        self.immediate = immediate
        self.pending: list[tuple[int, ResultFuture[int]]] = []
        self.invoked: list[int] = []

    def async_invoke(self, value: int, result_future: ResultFuture[int]) -> None:
        self.invoked.append(value)
        if self.immediate:
            result_future.complete(results_for(value))
        else:
            self.pending.append((value, result_future))


class Harness:
    """A task whose default action feeds ``inputs`` into one operator.

    With ``respect_capacity`` it suspends while the operator is full (back-pressure); without,
    it pushes everything at once so the operator's backlog fills. ``restored`` goes through
    ``restore()`` on the first default-action call. Unless ``hold_open`` the loop ends once the
    input is exhausted and the operator drained.
    """

    def __init__(
        self,
        function: Function,
        inputs: list[Element],
        *,
        mode: OutputMode,
        capacity: int,
        restored: list[Element] | None = None,
        hold_open: bool = False,
        respect_capacity: bool = True,
        key: Callable[[Any], tuple[Any, ...]] | None = None,
    ) -> None:
        self.function = function
        self.inputs: deque[Element] = deque(inputs)
        self.restored = restored
        self.hold_open = hold_open
        self.respect_capacity = respect_capacity
        self.out: list[Element] = []
        self.processor = MailboxProcessor(self._default_action, debug=True)
        output: Output[int] = Output(
            lambda value, ts: self.out.append(StreamRecord(value, ts)), self.out.append
        )
        self.operator: AsyncWaitOperator[int, int] = AsyncWaitOperator(
            function, output, self.processor, capacity=capacity, mode=mode, key=key
        )
        self.task: asyncio.Future[None] | None = None

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
        if self.respect_capacity and not self.operator.has_capacity():
            suspension = controller.suspend_default_action()
            self.operator.notify_when_available(suspension.resume)
            return
        element = self.inputs.popleft()
        if isinstance(element, Marker):
            self.operator.process_marker(element)
        else:
            self.operator.process_element(element.value, element.timestamp)

    def idle(self) -> bool:
        return self.processor.is_default_action_suspended and not self.processor.mailbox.has_mail()

    async def wait_until(self, condition: Callable[[], bool]) -> None:
        async def poll() -> None:
            while not condition():
                if self.task is not None and self.task.done():
                    self.task.result()
                    raise AssertionError("the mailbox loop ended before the condition held")
                await asyncio.sleep(0)

        await asyncio.wait_for(poll(), TIMEOUT)

    def run(self, driver: Callable[[Harness], Awaitable[None]] | None = None) -> list[Element]:
        async def main() -> None:
            await self.operator.open()
            self.task = asyncio.ensure_future(self.processor.run_loop())
            try:
                if driver is not None:
                    await asyncio.wait_for(driver(self), TIMEOUT)
                await asyncio.wait_for(self.task, TIMEOUT)
            finally:
                self.task.cancel()
                await self.operator.close()

        asyncio.run(main())
        return self.out


def complete_some(h: Harness, data: st.DataObject) -> None:
    """Complete a drawn batch of drawn pending requests (without letting the loop run)."""
    pending = h.function.pending
    for _ in range(data.draw(st.integers(1, len(pending)), label="batch")):
        value, future = pending.pop(data.draw(st.integers(0, len(pending) - 1), label="pick"))
        future.complete(results_for(value))


def complete_randomly(data: st.DataObject) -> Callable[[Harness], Awaitable[None]]:
    """Driver: whenever the loop waits, complete a random batch, until the loop ends."""

    async def drive(h: Harness) -> None:
        task = h.task
        assert task is not None
        pending = h.function.pending
        while True:
            # Idle with nothing pending happens only at the end (or on a deadlock, which the
            # bounded wait turns into a failure).
            await h.wait_until(lambda: task.done() or (h.idle() and bool(pending)))
            if task.done():
                return
            complete_some(h, data)

    return drive


# -- ORDERED: output order is input order --------------------------------------------------


@PROPERTY
@given(
    n=st.integers(1, 14),
    capacity=st.integers(1, 5),
    respect_capacity=st.booleans(),
    data=st.data(),
)
def test_ordered_output_is_input_order(
    n: int, capacity: int, respect_capacity: bool, data: st.DataObject
) -> None:
    inputs = make_inputs([False] * n)
    h = Harness(
        Function(immediate=False),
        inputs,
        mode=ORDERED,
        capacity=capacity,
        respect_capacity=respect_capacity,
    )
    out = h.run(complete_randomly(data))
    assert out == expected_output(inputs)
    assert h.function.invoked == list(range(n))
    assert h.operator.in_flight() == 0


# -- UNORDERED event time: no record crosses a watermark -----------------------------------


@PROPERTY
@given(
    kinds=st.lists(st.booleans(), min_size=2, max_size=14),
    capacity=st.integers(1, 5),
    respect_capacity=st.booleans(),
    data=st.data(),
)
def test_unordered_never_moves_a_record_across_a_watermark(
    kinds: list[bool], capacity: int, respect_capacity: bool, data: st.DataObject
) -> None:
    inputs = make_inputs(kinds)
    h = Harness(
        Function(immediate=False),
        inputs,
        mode=UNORDERED,
        capacity=capacity,
        respect_capacity=respect_capacity,
    )
    out = h.run(complete_randomly(data))
    assert as_multiset(out) == as_multiset(expected_output(inputs))
    assert_no_record_crosses_a_watermark(out)


# -- snapshot / restore at any point -------------------------------------------------------


@PROPERTY
@given(
    kinds=st.lists(st.booleans(), min_size=3, max_size=12),
    ordered=st.booleans(),
    capacity=st.integers(1, 5),
    restored_capacity=st.integers(1, 5),
    respect_capacity=st.booleans(),
    data=st.data(),
)
def test_snapshot_and_restore_at_any_point_emit_every_result_exactly_once(
    kinds: list[bool],
    ordered: bool,
    capacity: int,
    restored_capacity: int,
    respect_capacity: bool,
    data: st.DataObject,
) -> None:
    inputs = make_inputs(kinds)
    mode = ORDERED if ordered else UNORDERED
    # The first task reads a prefix of the input (drawn as the tail left over, which keeps
    # Hypothesis from favouring an empty prefix); the restored task reads the rest.
    prefix = len(inputs) - data.draw(st.integers(0, len(inputs)), label="tail")
    first = Harness(
        Function(immediate=False),
        inputs[:prefix],
        mode=mode,
        capacity=capacity,
        hold_open=True,
        respect_capacity=respect_capacity,
    )
    # What the snapshot mail saw: the operator state, how much had been emitted, and the
    # prefix input not yet read (the source offset of the checkpoint).
    taken: list[tuple[list[Element], int, list[Element]]] = []

    def snapshot() -> None:
        taken.append((first.operator.snapshot(), len(first.out), list(first.inputs)))

    async def run_prefix(h: Harness) -> None:
        await h.wait_until(h.idle)  # the prefix is read as far as the capacity lets it
        settled = True
        for _ in range(data.draw(st.integers(0, 6), label="rounds")):
            if not settled:
                await h.wait_until(h.idle)
            if not h.function.pending:
                break
            complete_some(h, data)
            settled = False
        # Snapshot at rest, or right after completions whose mail has not run yet (a
        # checkpoint-priority mail overtakes that mail).
        if not settled and data.draw(st.booleans(), label="settle first"):
            await h.wait_until(h.idle)
        priority = data.draw(st.sampled_from([DEFAULT_PRIORITY, MAX_PRIORITY]), label="prio")
        h.processor.executor(priority).execute(snapshot, "snapshot")
        await h.wait_until(lambda: bool(taken) and h.idle())
        # The old operator goes on a little after the checkpoint; none of it counts.
        while h.function.pending:
            value, future = h.function.pending.pop()
            future.complete(results_for(value))
        await h.wait_until(h.idle)
        h.processor.executor(MAX_PRIORITY).execute(h.processor.all_actions_completed, "stop")

    first.run(run_prefix)
    assert len(taken) == 1
    state, emitted, unread = taken[0]
    before = first.out[:emitted]

    second = Harness(
        Function(immediate=True),
        unread + inputs[prefix:],
        mode=mode,
        capacity=restored_capacity,
        restored=state,
        respect_capacity=respect_capacity,
    )
    after = second.run()

    combined = before + after
    expected = expected_output(inputs)
    if ordered:
        assert combined == expected
    else:
        assert as_multiset(combined) == as_multiset(expected)
        assert_no_record_crosses_a_watermark(combined)
    # The snapshot keeps input order and holds only what was fed and not yet emitted.
    positions = [position(e) for e in state]
    assert positions == sorted(positions)
