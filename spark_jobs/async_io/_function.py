"""The user-facing async function API (Flink's AsyncFunction / ResultFuture)."""

from __future__ import annotations

import abc
import asyncio
import itertools
from collections.abc import Iterable
from typing import Generic, TypeVar

__all__ = ["AsyncFunction", "AsyncTimeoutError", "CoroutineAsyncFunction", "ResultFuture"]

IN = TypeVar("IN")
OUT = TypeVar("OUT")


class AsyncTimeoutError(TimeoutError):
    """An async request did not complete within its timeout."""


class ResultFuture(abc.ABC, Generic[OUT]):
    """Completion handle of one input. Thread-safe; only the first completion counts."""

    __slots__ = ()

    @abc.abstractmethod
    def complete(self, results: Iterable[OUT]) -> None:
        """Deliver the (possibly empty) list of outputs for the input."""

    @abc.abstractmethod
    def complete_exceptionally(self, error: BaseException) -> None:
        """Fail the input; the error fails the task."""


class AsyncFunction(abc.ABC, Generic[IN, OUT]):
    """Starts an asynchronous operation per input and completes its ResultFuture later.

    ``async_invoke`` runs on the mailbox thread and must not block: start the I/O and return.
    ``open``/``close`` run on the task's event loop (create and dispose clients there).
    """

    async def open(self) -> None:
        """Acquire clients (connection pools …) before the first input."""

    async def close(self) -> None:
        """Release what ``open`` acquired."""

    @abc.abstractmethod
    def async_invoke(self, value: IN, result_future: ResultFuture[OUT]) -> None:
        """Start the request for ``value``; complete ``result_future`` when it finishes."""

    def timeout(self, value: IN, result_future: ResultFuture[OUT]) -> None:
        """Called when ``value`` timed out; by default fails the task."""
        result_future.complete_exceptionally(
            AsyncTimeoutError(f"async request timed out: {value!r}")
        )


class CoroutineAsyncFunction(AsyncFunction[IN, OUT]):
    """Coroutine style: implement ``invoke`` as ``async def`` returning the list of outputs."""

    @abc.abstractmethod
    async def invoke(self, value: IN) -> list[OUT]:
        """Produce the outputs for ``value``."""

    def async_invoke(self, value: IN, result_future: ResultFuture[OUT]) -> None:
        try:
            running = self.__running
        except AttributeError:
            running = self.__running = {}
            self.__keys = itertools.count()
        key = next(self.__keys)
        # asyncio keeps only weak references to tasks: hold each one until it is done.
        running[key] = asyncio.get_running_loop().create_task(self.__run(value, result_future, key))

    async def __run(self, value: IN, result_future: ResultFuture[OUT], key: int) -> None:
        # Completing from inside the task saves the done-callback hop through the loop.
        try:
            results = await self.invoke(value)
        except BaseException as error:  # handed to the operator, which fails the task
            result_future.complete_exceptionally(error)
        else:
            result_future.complete(results)
        finally:
            del self.__running[key]

    __running: dict[int, asyncio.Task[None]]
    __keys: itertools.count[int]
