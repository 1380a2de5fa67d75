"""The one line of a Spark job that failed after its stage attempts (issue 21: a raising
AsyncMap ended in ~470 lines of Spark, Py4J and Python tracebacks and no summary line)."""

from __future__ import annotations

from spark_jobs._outcomes import RunFailed, job_failure

# The shape of Py4JJavaError's text for a failed barrier stage (from a real run, shortened).
MESSAGE = """An error occurred while calling o71.collectAndServe.
: org.apache.spark.SparkException: Job aborted due to stage failure: ShuffleMapStage 0 \
(partitionBy at /repo/spark_jobs/jobs/_spark_stage.py:42) has failed the maximum allowable \
number of times: 4. Most recent failure reason: org.apache.spark.api.python.PythonException: \
[PYTHON_EXCEPTION] An exception was thrown from the Python worker: Traceback (most recent call \
last):
  File "/venv/pyspark/worker.py", line 4327, in invoke_udf
    run_process()
  File "/repo/spark_jobs/jobs/_subtask.py", line 47, in run_reader_subtask
    raise SubtaskFailed(_redacted(exc, config)) from None
spark_jobs.jobs._subtask.SubtaskFailed: Traceback (most recent call last):
  File "/repo/spark_jobs/runtime/_mailbox.py", line 65, in run
    self.action()
  File "/repo/spark_jobs/async_io/_operator.py", line 296, in _complete
    raise self._failure
  File "/repo/examples/scoring.py", line 12, in invoke
    raise RuntimeError(f"scoring service refused record {n}")
RuntimeError: scoring service refused record 2500
 SQLSTATE: 38000
\tat org.apache.spark.api.python.BasePythonRunner$ReaderIterator.handlePythonException(X.scala:1)
\tat org.apache.spark.api.python.PythonRunner$$anon$3.read(PythonRunner.scala:1)
"""


def test_the_last_python_error_of_a_failed_job_is_its_one_line() -> None:
    failed = job_failure(Exception(MESSAGE), "scores")
    assert isinstance(failed, RunFailed)
    assert str(failed) == (
        "pipeline scores: the Spark job failed after 4 stage attempts: "
        "RuntimeError: scoring service refused record 2500"
    )


def test_an_error_without_a_python_traceback_is_left_alone() -> None:
    assert job_failure(Exception("Connection refused: localhost/127.0.0.1:7077"), "p") is None
    assert job_failure(KeyboardInterrupt(), "p") is None
