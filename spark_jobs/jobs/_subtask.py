"""Entry point of a reader subtask inside a Spark task (a Python worker's thread)."""

from __future__ import annotations

import gc

from spark_jobs.jobs._reader_task import ReaderTask
from spark_jobs.jobs._results import SubtaskResult
from spark_jobs.jobs._task_config import TaskConfig
from spark_jobs.runtime import run_task

__all__ = ["run_reader_subtask"]


#: Young-generation threshold while a subtask runs (CPython's default is 700). A subtask
#: allocates a few container objects per record and keeps up to ``capacity`` records plus
#: the lookup cache alive, so the default collects the young generation every few hundred
#: records and walks the survivors each time: over a third of worker CPU when profiled.
_GC_YOUNG_THRESHOLD = 50_000


def run_reader_subtask(config: TaskConfig, subtask: int) -> SubtaskResult:
    """Entry point inside a Spark task: run subtask ``subtask`` of the run to completion."""
    thresholds = gc.get_threshold()
    # Objects alive before the task (imports, Spark's worker state) are never garbage:
    # freezing them keeps every collection from walking them again.
    gc.collect()
    gc.freeze()
    gc.set_threshold(_GC_YOUNG_THRESHOLD, thresholds[1], thresholds[2])
    try:
        return run_task(ReaderTask(config, subtask).run)
    finally:
        gc.set_threshold(*thresholds)
        gc.unfreeze()
