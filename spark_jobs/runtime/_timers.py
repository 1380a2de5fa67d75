"""Processing-time timers whose callbacks arrive as mails.

``AsyncioTimerService`` uses the task's event loop clock; ``ManualTimerService`` is a virtual
clock for tests: time moves only when the test calls ``advance``.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import heapq
import itertools
from collections.abc import Callable

from spark_jobs.runtime._mailbox import MailboxClosedError, MailboxExecutor

__all__ = ["AsyncioTimerService", "ManualTimerService", "TimerHandle", "TimerService"]


class TimerHandle:
    """A registered timer; ``cancel`` is idempotent. Mailbox thread only."""

    __slots__ = ("_cancel", "cancelled", "when")

    def __init__(self, when: float, cancel: Callable[[], None]) -> None:
        self.when = when
        self.cancelled = False
        self._cancel = cancel

    def cancel(self) -> None:
        if not self.cancelled:
            self.cancelled = True
            self._cancel()


class TimerService(abc.ABC):
    """Schedules callbacks at absolute times (seconds); callbacks run as mails."""

    @abc.abstractmethod
    def now(self) -> float:
        """Current time of this service's clock."""

    @abc.abstractmethod
    def register(self, when: float, callback: Callable[[], None]) -> TimerHandle:
        """Run ``callback`` as a mail once the clock reaches ``when``."""

    @abc.abstractmethod
    def pending(self) -> int:
        """Timers registered and neither fired nor cancelled."""


class AsyncioTimerService(TimerService):
    """Timers on the event loop that is the mailbox thread."""

    def __init__(self, executor: MailboxExecutor) -> None:
        self._executor = executor
        self._live = 0
        self._loop: asyncio.AbstractEventLoop | None = None

    def now(self) -> float:
        loop = self._loop
        if loop is None:  # bound lazily: the service may be built before the loop runs
            loop = self._loop = asyncio.get_running_loop()
        return loop.time()

    def register(self, when: float, callback: Callable[[], None]) -> TimerHandle:
        loop = asyncio.get_running_loop()
        self._live += 1

        def fire() -> None:
            if not handle.cancelled:
                handle.cancelled = True  # fired: cancel() becomes a no-op
                self._live -= 1
                with contextlib.suppress(MailboxClosedError):  # the task already ended
                    self._executor.execute(callback, "timer")

        timer = loop.call_at(when, fire)

        def cancel() -> None:
            timer.cancel()
            self._live -= 1

        handle = TimerHandle(when, cancel)
        return handle

    def pending(self) -> int:
        return self._live


class ManualTimerService(TimerService):
    """Virtual time for tests: ``advance`` fires due timers as mails, in deadline order."""

    def __init__(self, executor: MailboxExecutor | None = None, start: float = 0.0) -> None:
        self._executor = executor
        self._now = start
        self._heap: list[tuple[float, int, TimerHandle, Callable[[], None]]] = []
        self._seq = itertools.count()

    def bind(self, executor: MailboxExecutor) -> None:
        self._executor = executor

    def now(self) -> float:
        return self._now

    def register(self, when: float, callback: Callable[[], None]) -> TimerHandle:
        handle = TimerHandle(when, lambda: None)
        heapq.heappush(self._heap, (when, next(self._seq), handle, callback))
        return handle

    def pending(self) -> int:
        return sum(1 for _, _, handle, _ in self._heap if not handle.cancelled)

    def advance(self, seconds: float) -> None:
        """Move the clock forward; due timers are posted as mails (priority: timers first)."""
        assert self._executor is not None, "bind() the service to a mailbox executor first"
        self._now += seconds
        while self._heap and self._heap[0][0] <= self._now:
            _, _, handle, callback = heapq.heappop(self._heap)
            if not handle.cancelled:
                handle.cancelled = True
                self._executor.execute(callback, "timer")
