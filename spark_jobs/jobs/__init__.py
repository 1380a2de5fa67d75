"""PySpark job entry points."""

from spark_jobs.jobs._driver import RunSummary, run_enrichment
from spark_jobs.jobs._reader_task import ReaderTask
from spark_jobs.jobs._subtask import run_reader_subtask
from spark_jobs.jobs._task_config import TaskConfig

__all__ = ["ReaderTask", "RunSummary", "TaskConfig", "run_enrichment", "run_reader_subtask"]
