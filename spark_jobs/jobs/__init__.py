"""PySpark job entry points: a pipeline run's driver and its reader subtasks."""

from spark_jobs.jobs._driver import ReaderRun, run_pipeline
from spark_jobs.jobs._heartbeat import Heartbeat
from spark_jobs.jobs._reader_task import ReaderTask
from spark_jobs.jobs._results import StepMetrics, SubtaskResult
from spark_jobs.jobs._subtask import run_reader_subtask
from spark_jobs.jobs._summary import RunSummary
from spark_jobs.jobs._task_config import StepDefaults, TaskConfig

__all__ = [
    "Heartbeat",
    "ReaderRun",
    "ReaderTask",
    "RunSummary",
    "StepDefaults",
    "StepMetrics",
    "SubtaskResult",
    "TaskConfig",
    "run_pipeline",
    "run_reader_subtask",
]
