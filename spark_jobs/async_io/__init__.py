"""Flink's async I/O operator: AsyncFunction, ResultFuture, ordered/unordered queues."""

from spark_jobs.async_io._elements import Marker, StreamRecord, Watermark
from spark_jobs.async_io._function import (
    AsyncFunction,
    AsyncTimeoutError,
    CoroutineAsyncFunction,
    ResultFuture,
)
from spark_jobs.async_io._operator import AsyncWaitOperator, OutputMode, QueueFullError
from spark_jobs.async_io._queues import (
    OrderedQueue,
    Output,
    QueueEntry,
    StreamElementQueue,
    UnorderedQueue,
)

__all__ = [
    "AsyncFunction",
    "AsyncTimeoutError",
    "AsyncWaitOperator",
    "CoroutineAsyncFunction",
    "Marker",
    "OrderedQueue",
    "Output",
    "OutputMode",
    "QueueEntry",
    "QueueFullError",
    "ResultFuture",
    "StreamElementQueue",
    "StreamRecord",
    "UnorderedQueue",
    "Watermark",
]
