"""The async operator's element timeouts: one timer for the earliest deadline.

Every element gets ``now + timeout`` when it is invoked, and ``now`` never goes back, so the
deadlines are appended in time order and the earliest is always first: one registered timer
suffices. Threading: mailbox thread only (the timer service fires on it); never blocks.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Generic, TypeVar

from spark_jobs.async_io._queues import QueueEntry
from spark_jobs.runtime._timers import TimerHandle, TimerService

__all__ = ["Deadlines"]

OUT = TypeVar("OUT")


class Deadlines(Generic[OUT]):
    """Calls ``expire(entry)`` for each entry not done by its deadline."""

    __slots__ = ("_entries", "_expire", "_timer", "_timers", "timeout")

    def __init__(
        self, timers: TimerService, timeout: float, expire: Callable[[QueueEntry[OUT]], None]
    ) -> None:
        self._timers = timers
        self.timeout = timeout
        self._expire = expire
        self._entries: deque[tuple[float, QueueEntry[OUT]]] = deque()
        self._timer: TimerHandle | None = None

    def add(self, entry: QueueEntry[OUT]) -> None:
        """``entry`` was invoked now: it times out ``timeout`` seconds from now."""
        self._entries.append((self._timers.now() + self.timeout, entry))
        if self._timer is None:
            self._arm()

    def cancel(self) -> None:
        """Forget every deadline (nothing is in flight, or the operator closes)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._entries.clear()

    def _arm(self) -> None:
        entries = self._entries
        while entries and entries[0][1].done:
            entries.popleft()
        if entries and self._timer is None:
            self._timer = self._timers.register(entries[0][0], self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        now = self._timers.now()
        entries = self._entries
        while entries and entries[0][0] <= now:
            _, entry = entries.popleft()
            if not entry.done:
                self._expire(entry)
        self._arm()
