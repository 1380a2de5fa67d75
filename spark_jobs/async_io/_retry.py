"""Retry strategies of the async operator (Flink's AsyncRetryStrategies)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "EMPTY_RESULT",
    "HAS_EXCEPTION",
    "NO_RETRY",
    "AsyncRetryStrategy",
    "exponential_backoff",
    "fixed_delay",
]

ResultPredicate = Callable[[Sequence[Any]], bool]
ExceptionPredicate = Callable[[BaseException], bool]


def EMPTY_RESULT(results: Sequence[Any]) -> bool:
    """A result predicate for `fixed_delay`/`exponential_backoff`: retry when the function
    completed with no result."""
    return len(results) == 0


def HAS_EXCEPTION(_error: BaseException) -> bool:
    """An exception predicate for `fixed_delay`/`exponential_backoff`: retry on any
    exception."""
    return True


@dataclass(frozen=True, slots=True)
class AsyncRetryStrategy:
    """When and how often to call the async function again for one input.

    ``max_attempts`` counts *retries* (Flink's meaning): the function is called at most
    ``max_attempts + 1`` times. The operator's timeout spans all attempts; when it fires, the
    function's ``timeout()`` decides the result and no further retry happens.
    """

    max_attempts: int = 0
    delay: Callable[[int], float] = lambda _attempt: 0.0
    on_result: ResultPredicate | None = None
    on_exception: ExceptionPredicate | None = None

    @property
    def enabled(self) -> bool:
        return self.max_attempts > 0 and (
            self.on_result is not None or self.on_exception is not None
        )

    def can_retry(self, retries_done: int) -> bool:
        return retries_done < self.max_attempts

    def backoff(self, retry_number: int) -> float:
        """Seconds to wait before retry number ``retry_number`` (1-based)."""
        return self.delay(retry_number)


NO_RETRY = AsyncRetryStrategy()


def fixed_delay(
    max_attempts: int,
    delay: float,
    *,
    on_result: ResultPredicate | None = None,
    on_exception: ExceptionPredicate | None = None,
) -> AsyncRetryStrategy:
    """A retry strategy for `AsyncMap(retry=...)`: retries `delay` seconds apart.

    ```python
    from spark_jobs import EMPTY_RESULT, HAS_EXCEPTION, fixed_delay

    retry = fixed_delay(3, 0.5, on_result=EMPTY_RESULT, on_exception=HAS_EXCEPTION)
    ```

    Without a predicate nothing is retried. The step's `timeout` spans all attempts (a
    retry strategy needs one); when it fires, the function's `timeout()` decides.

    Args:
        max_attempts: Retries after the first call (at least 1): at most `max_attempts + 1`
            calls per element.
        delay: Seconds between two calls.
        on_result: Retry when this returns true for the results of a call (e.g.
            `EMPTY_RESULT`).
        on_exception: Retry when this returns true for the exception a call completed with
            (e.g. `HAS_EXCEPTION`); else the exception fails the task.
    """
    if max_attempts < 1 or delay < 0:
        raise ValueError("fixed_delay needs max_attempts >= 1 and delay >= 0")
    return AsyncRetryStrategy(max_attempts, lambda _n: delay, on_result, on_exception)


def exponential_backoff(
    max_attempts: int,
    initial_delay: float,
    max_delay: float,
    multiplier: float = 2.0,
    *,
    on_result: ResultPredicate | None = None,
    on_exception: ExceptionPredicate | None = None,
) -> AsyncRetryStrategy:
    """A retry strategy for `AsyncMap(retry=...)`: delays grow by `multiplier` from
    `initial_delay` up to `max_delay`.

    Without a predicate nothing is retried; see `fixed_delay`.

    Args:
        max_attempts: Retries after the first call (at least 1).
        initial_delay: Seconds before the first retry.
        max_delay: Most seconds between two calls.
        multiplier: Each delay is the previous one times this (at least 1).
        on_result: Retry when this returns true for the results of a call.
        on_exception: Retry when this returns true for the exception a call completed with.
    """
    if max_attempts < 1 or initial_delay < 0 or max_delay < initial_delay or multiplier < 1:
        raise ValueError("exponential_backoff needs max_attempts >= 1, 0 <= initial <= max, m >= 1")
    return AsyncRetryStrategy(
        max_attempts,
        lambda n: min(max_delay, initial_delay * multiplier ** (n - 1)),
        on_result,
        on_exception,
    )
