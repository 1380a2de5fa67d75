"""The user's async functions inside the operator chain.

An ``AsyncMap`` step hands the user's function only what it may see (one record as a dict,
or a batch without the hidden offset column) and receives the results back with the element
they belong to (:class:`Completed`), so the step can merge them onto the record or batch.
The user's own ``timeout()`` and retry predicates see exactly what they would see in Flink:
the value, and the results list the function completed with.

Threading: ``async_invoke``/``timeout`` run on the mailbox thread (the task's event loop);
the user's completions may come from any thread and are handed to the operator unchanged.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from spark_jobs.async_io import (
    AsyncFunction,
    AsyncRetryStrategy,
    CoroutineAsyncFunction,
    ResultFuture,
)

__all__ = ["Completed", "UserFunction", "as_async_function", "results_retry"]


@dataclass(slots=True)
class Completed:
    """The results the user's function completed an element with, beside the element."""

    element: Any
    results: list[Any]


class _Converting(ResultFuture[Any]):
    """The future the user completes: passes ``Completed(element, results)`` on."""

    __slots__ = ("_element", "_inner")

    def __init__(self, inner: ResultFuture[Completed], element: Any) -> None:
        self._inner = inner
        self._element = element

    def complete(self, results: Iterable[Any]) -> None:
        self._inner.complete([Completed(self._element, list(results))])

    def complete_exceptionally(self, error: BaseException) -> None:
        self._inner.complete_exceptionally(error)


class _Coroutine(CoroutineAsyncFunction[Any, Any]):
    """A plain ``async def``: a per-record function returns a dict, a list of dicts or
    None (no output); a per-batch one returns a RecordBatch."""

    def __init__(self, function: Callable[[Any], Any], per_record: bool) -> None:
        self._function = function
        self._per_record = per_record

    async def invoke(self, value: Any) -> list[Any]:
        result = await self._function(value)
        if self._per_record:
            if result is None:
                return []
            return [result] if isinstance(result, dict) else list(result)
        if isinstance(result, pa.RecordBatch | pa.Table):
            return [result]
        raise TypeError(f"a per-batch function must return a RecordBatch, got {result!r}")


def as_async_function(function: Any, *, per_record: bool) -> AsyncFunction[Any, Any]:
    """The user's function as an :class:`AsyncFunction` (plain coroutines are wrapped)."""
    if isinstance(function, AsyncFunction):
        return function
    if inspect.iscoroutinefunction(function):
        return _Coroutine(function, per_record)
    raise TypeError(f"not an async function: {function!r}")


class UserFunction(AsyncFunction[Any, Completed]):
    """Runs ``function`` on ``view(element)`` for each element of the operator."""

    def __init__(self, function: AsyncFunction[Any, Any], view: Callable[[Any], Any]) -> None:
        self._function = function
        self._view = view

    async def open(self) -> None:
        await self._function.open()

    async def close(self) -> None:
        await self._function.close()

    def async_invoke(self, value: Any, result_future: ResultFuture[Completed]) -> None:
        self._function.async_invoke(self._view(value), _Converting(result_future, value))

    def timeout(self, value: Any, result_future: ResultFuture[Completed]) -> None:
        self._function.timeout(self._view(value), _Converting(result_future, value))


def results_retry(strategy: AsyncRetryStrategy) -> AsyncRetryStrategy:
    """``strategy`` with its result predicate applied to the user's results list (the
    operator sees ``[Completed]``)."""
    on_result = strategy.on_result
    if on_result is None:
        return strategy
    return AsyncRetryStrategy(
        strategy.max_attempts,
        strategy.delay,
        lambda results: bool(on_result(results[0].results)),
        strategy.on_exception,
    )
