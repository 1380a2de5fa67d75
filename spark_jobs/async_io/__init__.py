"""Flink's async I/O operator: AsyncFunction, ResultFuture, ordered/unordered/key-ordered
queues."""

from spark_jobs.async_io._elements import Marker, StreamRecord, Watermark
from spark_jobs.async_io._function import (
    AsyncFunction,
    AsyncTimeoutError,
    CoroutineAsyncFunction,
    ResultFuture,
)
from spark_jobs.async_io._key_queue import KeyOrderedQueue
from spark_jobs.async_io._operator import AsyncWaitOperator, OutputMode
from spark_jobs.async_io._queues import (
    OrderedQueue,
    Output,
    QueueEntry,
    StreamElementQueue,
    UnorderedQueue,
)
from spark_jobs.async_io._retry import (
    EMPTY_RESULT,
    HAS_EXCEPTION,
    NO_RETRY,
    AsyncRetryStrategy,
    exponential_backoff,
    fixed_delay,
)

__all__ = [
    "EMPTY_RESULT",
    "HAS_EXCEPTION",
    "NO_RETRY",
    "AsyncFunction",
    "AsyncRetryStrategy",
    "AsyncTimeoutError",
    "AsyncWaitOperator",
    "CoroutineAsyncFunction",
    "KeyOrderedQueue",
    "Marker",
    "OrderedQueue",
    "Output",
    "OutputMode",
    "QueueEntry",
    "ResultFuture",
    "StreamElementQueue",
    "StreamRecord",
    "UnorderedQueue",
    "Watermark",
    "exponential_backoff",
    "fixed_delay",
]
