"""The SparkSession Sluice runs on."""

from __future__ import annotations

import os
import re
import sys
from typing import Any

__all__ = ["get_spark"]


def _with_retries(master: str, attempts: int) -> str:
    # Spark's local mode ignores spark.task.maxFailures; "local[N,F]" is how it allows retries.
    match = re.fullmatch(r"local\[(\*|\d+)\]", master)
    if match:
        return f"local[{match.group(1)},{attempts}]"
    if master == "local":
        return f"local[1,{attempts}]"
    return master


def get_spark(master: str, *, app_name: str = "sluice", task_attempts: int = 4) -> Any:
    """Get or create the SparkSession; Python workers use this very interpreter."""
    # Workers must run the driver's interpreter (the virtualenv), not python3 from PATH.
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    spark = (
        SparkSession.builder.master(_with_retries(master, task_attempts))
        .appName(app_name)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        # Exactly-once relies on one live attempt per subtask; fencing covers zombies.
        .config("spark.speculation", "false")
        .config("spark.task.maxFailures", str(task_attempts))
        .config("spark.python.worker.reuse", "true")
        .config("spark.sql.session.timeZone", "UTC")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    return spark
