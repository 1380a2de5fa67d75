"""The SparkSession Sluice runs on."""

from __future__ import annotations

import os
import re
import shutil
import socket
import sys
from pathlib import Path
from typing import Any

from enumerator_service import ConfigError

__all__ = ["get_spark"]


def _with_retries(master: str, attempts: int) -> str:
    # Spark's local mode ignores spark.task.maxFailures; "local[N,F]" is how it allows retries.
    match = re.fullmatch(r"local\[(\*|\d+)\]", master)
    if match:
        return f"local[{match.group(1)},{attempts}]"
    if master == "local":
        return f"local[1,{attempts}]"
    return master


_LOG4J = Path(__file__).with_name("log4j2.properties")


def _check_java() -> None:
    java_home = os.environ.get("JAVA_HOME")
    if java_home and (Path(java_home) / "bin" / "java").exists():
        return
    if shutil.which("java") is None:
        raise ConfigError("JAVA_HOME", "no java found on PATH; Spark needs Java 17 or newer")


def _driver_addresses(master: str, driver_host: str | None) -> tuple[str, str]:
    """(advertised host, bind address) of the driver.

    Local masters keep everything on 127.0.0.1. With a cluster master the executors must
    connect back to the driver, so it binds to all interfaces and advertises ``driver_host``
    (default: this machine's host name, which is the service name under docker compose).
    """
    if master.startswith("local"):
        return driver_host or "127.0.0.1", driver_host or "127.0.0.1"
    return driver_host or socket.gethostname(), "0.0.0.0"  # noqa: S104 - executors connect in


def get_spark(
    master: str,
    *,
    app_name: str = "sluice",
    task_attempts: int = 4,
    driver_host: str | None = None,
) -> Any:
    """Get or create the SparkSession; Python workers use this very interpreter."""
    _check_java()
    # Workers must run the driver's interpreter (the virtualenv), not python3 from PATH.
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    host, bind = _driver_addresses(master, driver_host)

    spark = (
        SparkSession.builder.master(_with_retries(master, task_attempts))
        .appName(app_name)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.host", host)
        .config("spark.driver.bindAddress", bind)
        # Exactly-once relies on one live attempt per subtask; fencing covers zombies.
        .config("spark.speculation", "false")
        .config("spark.task.maxFailures", str(task_attempts))
        .config("spark.python.worker.reuse", "true")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.extraJavaOptions", f"-Dlog4j2.configurationFile={_LOG4J.as_uri()}")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    return spark
