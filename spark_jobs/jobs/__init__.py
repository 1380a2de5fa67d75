"""PySpark job entry points."""

from spark_jobs.jobs._driver import RunSummary, run_enrichment
from spark_jobs.jobs._reader_task import ReaderTask, TaskConfig, run_reader_subtask

__all__ = ["ReaderTask", "RunSummary", "TaskConfig", "run_enrichment", "run_reader_subtask"]
