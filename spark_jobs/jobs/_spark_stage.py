"""The run's subtasks as one Spark stage: gang-scheduled (a barrier stage) or plain."""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Iterator
from typing import Any

from spark_jobs.jobs._results import SubtaskResult
from spark_jobs.jobs._subtask import run_reader_subtask
from spark_jobs.jobs._task_config import TaskConfig

__all__ = ["cancel_subtasks", "run_subtasks"]

#: How long the caller's wait for the job sleeps at a time (an interrupt ends it at once;
#: the bound only keeps the wait short where a signal cannot break a lock's wait).
_JOIN_SECONDS = 0.5


def _subtask_partition(config: TaskConfig, index: int, _rows: Iterator[Any]) -> Iterator[Any]:
    yield run_reader_subtask(config, index)


def _keyed(result: SubtaskResult) -> tuple[int, SubtaskResult]:
    return result.subtask, result


def run_subtasks(spark: Any, config: TaskConfig, parallelism: int, gang: bool) -> list[Any]:
    """The run's ``parallelism`` subtasks as one Spark stage; their results.

    ``gang``: a barrier stage — all subtasks start together or none does (a subtask that got
    a slot would otherwise wait forever for checkpoints the unscheduled ones never
    acknowledge), and when one fails Spark kills the others and restarts the whole stage:
    every subtask restores from the last completed checkpoint (new split epochs fence the
    old attempts; a finished subtask's new attempt ends at once). Spark restarts only a
    barrier *shuffle map* stage (a result stage may have published output), hence the
    one-partition shuffle of the (tiny) results behind it. That shuffle's result stage runs
    in the JVM only (the pairs are collected as they are and unkeyed here): a Python step
    after it (``.values()``) cost a Python task of its own, ~60 ms of every run.
    """
    subtasks = spark.sparkContext.parallelize(range(parallelism), parallelism)
    run = functools.partial(_subtask_partition, config)
    if not gang:
        return list(_interruptible(subtasks.mapPartitionsWithIndex(run).collect))
    stage = subtasks.barrier().mapPartitionsWithIndex(run)
    pairs = _interruptible(stage.map(_keyed).partitionBy(1).collect)
    return [result for _subtask, result in pairs]


def _interruptible(collect: Callable[[], list[Any]]) -> list[Any]:
    """``collect()`` on a thread of its own while the caller waits in short joins.

    An interrupt (Ctrl-C, SIGTERM, a Dagster termination: its signal handler raises in the
    main thread) then lands in the join, outside Py4J. Raised inside the Py4J call, it left
    that thread's connection with the job's answer unread (PySpark pins one connection to
    each thread): the cancellation that follows read the wrong answer, the job was never
    cancelled, and a continuous run kept checkpointing under a CANCELING Dagster run.
    """
    outcome: dict[str, Any] = {}

    def target() -> None:
        try:
            outcome["result"] = collect()
        except BaseException as exc:  # raised on the caller's thread below
            outcome["error"] = exc

    from pyspark import InheritableThread  # (the job's local properties go with it)

    worker = InheritableThread(target=target, name="sluice-spark-job", daemon=True)
    worker.start()
    while worker.is_alive():
        worker.join(_JOIN_SECONDS)
    if "error" in outcome:
        raise outcome["error"]
    return list(outcome["result"])


def cancel_subtasks(spark: Any, drain_seconds: float = 20.0) -> None:
    """Cancel the run's Spark job and wait (at most ``drain_seconds``) for its tasks to end.

    Spark fails the job at once but its tasks end later (a Python worker finishes what it was
    doing). A process that exits meanwhile stops the SparkContext under a running task, whose
    completion listener then logs an INTERNAL_ERROR_STORAGE stack trace after the run's own
    one-line error. Waiting for the executors to report no running task avoids that.
    """
    context = spark.sparkContext
    context.cancelAllJobs()
    tracker = context._jsc.sc().statusTracker()
    deadline = time.monotonic() + drain_seconds
    while time.monotonic() < deadline:
        if sum(info.numRunningTasks() for info in tracker.getExecutorInfos()) == 0:
            return
        time.sleep(0.1)
