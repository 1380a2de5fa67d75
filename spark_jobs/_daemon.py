"""PySpark's Python worker daemon, with Sluice's worker modules imported before it forks.

Spark starts one daemon per executor (``spark.python.daemon.module``, set by
:func:`spark_jobs._spark.get_spark`) and forks every Python worker from it. The stock
``pyspark.daemon`` imports almost nothing, so each new worker imported the reader subtask's
modules (pyarrow, SQLAlchemy, psycopg, asyncpg, ...) in its first task: ~1.3 s of a small
run's wall time on the reference machine, paid again by every worker Spark replaces. Imported
here, they are in every forked worker already (shared copy-on-write).

Only imports, then a garbage collector freeze: nothing here starts a thread, opens a
connection or a file, so forking stays safe. Dagster and the CLI are never imported on
executors.
"""

from __future__ import annotations

import gc

import pyarrow.compute
import pyarrow.json
import pyarrow.parquet
import pyspark.daemon

import spark_jobs.jobs._subtask

__all__: list[str] = []

# (Referenced so that linters keep the imports: they exist for their side effect.)
_PRELOADED = (pyarrow.compute, pyarrow.json, pyarrow.parquet, spark_jobs.jobs._subtask)

if __name__ == "__main__":
    # Never garbage (modules stay loaded): frozen, the workers' collections never walk them.
    # A reader subtask collected all ~110k of them at its start, 40-110 ms on the reference
    # machine; it now collects only what is not frozen (see jobs._subtask).
    gc.collect()
    gc.freeze()
    pyspark.daemon.manager()
