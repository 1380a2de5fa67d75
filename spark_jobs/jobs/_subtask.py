"""Entry point of a reader subtask inside a Spark task (a Python worker's thread)."""

from __future__ import annotations

import contextlib
import gc
import traceback

from enumerator_service import redact_text
from spark_jobs.jobs._fatal import stop_the_run
from spark_jobs.jobs._reader_task import ReaderTask
from spark_jobs.jobs._results import SubtaskResult
from spark_jobs.jobs._task_config import TaskConfig
from spark_jobs.jobs._user_errors import deterministic_error
from spark_jobs.runtime import run_task

__all__ = ["SubtaskFailed", "run_reader_subtask"]


class SubtaskFailed(RuntimeError):
    """A subtask failed; the message is the failure's traceback with the database password
    (in any encoding) and every URL redacted: Spark ships it to the driver, which logs it and
    raises it in the run's error."""


#: Young-generation threshold while a subtask runs (CPython's default is 700). A subtask
#: allocates a few container objects per record and keeps up to ``capacity`` records plus
#: the lookup cache alive, so the default collects the young generation every few hundred
#: records and walks the survivors each time: over a third of worker CPU when profiled.
_GC_YOUNG_THRESHOLD = 50_000


def run_reader_subtask(config: TaskConfig, subtask: int) -> SubtaskResult:
    """Entry point inside a Spark task: run subtask ``subtask`` of the run to completion."""
    thresholds = gc.get_threshold()
    # Objects alive before the task (imports, Spark's worker state) are never garbage:
    # freezing them keeps every collection from walking them again. A worker forked from
    # spark_jobs._daemon has the imports frozen already (for good: modules stay loaded), and
    # the rest is small, so it only collects; unfreezing here would undo the daemon's freeze
    # for every later task of this reused worker, each then walking every import again.
    frozen_by_daemon = gc.get_freeze_count() > 0
    gc.collect()
    if not frozen_by_daemon:
        gc.freeze()
    gc.set_threshold(_GC_YOUNG_THRESHOLD, thresholds[1], thresholds[2])
    try:
        config.register_connectors()
        return run_task(ReaderTask(config, subtask).run)
    except Exception as exc:
        line = deterministic_error(exc)
        if line is None:
            raise SubtaskFailed(_redacted(exc, config)) from None
        # Retrying cannot help: the driver stops the run (see _fatal). One line, not a trace.
        line = _redact(line, config)  # the password too, not only the URLs
        if not line.startswith("pipeline "):
            line = f"pipeline {config.source}: {line}"
        stop_the_run(config, subtask, line)
        raise SubtaskFailed(line) from None
    finally:
        gc.set_threshold(*thresholds)
        if not frozen_by_daemon:
            gc.unfreeze()


def _redacted(exc: Exception, config: TaskConfig) -> str:
    return _redact("".join(traceback.format_exception(exc)), config)


def _redact(text: str, config: TaskConfig) -> str:
    urls = [config.database.url]
    # With the password, to find it in the text (if it cannot be read, there is none to hide).
    with contextlib.suppress(Exception):
        urls.append(config.database_url)
    return redact_text(text, *urls)
