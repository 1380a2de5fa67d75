"""The ResultFutures the async operator hands to its function.

A completion never touches operator state directly: both classes only pass it to the operator,
which queues it for the mailbox thread (see ``AsyncWaitOperator._deliver``).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, TypeVar

from spark_jobs.async_io._function import ResultFuture
from spark_jobs.async_io._queues import QueueEntry

if TYPE_CHECKING:
    from spark_jobs.async_io._operator import AsyncWaitOperator

__all__ = ["_Attempt", "_Entry"]

OUT = TypeVar("OUT")


class _Attempt(ResultFuture[OUT]):
    """ResultFuture of one attempt of one entry; completions of superseded attempts drop."""

    __slots__ = ("_attempt", "_entry", "_operator")

    def __init__(
        self, operator: AsyncWaitOperator[Any, OUT], entry: QueueEntry[OUT], attempt: int
    ) -> None:
        self._operator = operator
        self._entry = entry
        self._attempt = attempt

    def complete(self, results: Iterable[OUT]) -> None:
        if type(results) is not list:
            results = list(results)
        self._operator._deliver(self._entry, self._attempt, results, None)

    def complete_exceptionally(self, error: BaseException) -> None:
        self._operator._deliver(self._entry, self._attempt, None, error)


class _Entry(QueueEntry[OUT], ResultFuture[OUT]):
    """A queue entry that is also its element's ResultFuture (when there are no retries).

    Saves an object and a call per element; each operator binds its own subclass so the entry
    knows its operator without a per-entry reference.
    """

    __slots__ = ()
    operator: AsyncWaitOperator[Any, OUT]

    def complete(self, results: Iterable[OUT]) -> None:
        if type(results) is not list:
            results = list(results)
        self.operator._deliver_own(self, results, None)

    def complete_exceptionally(self, error: BaseException) -> None:
        self.operator._deliver_own(self, None, error)
