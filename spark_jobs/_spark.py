"""The SparkSession Sluice runs on.

A run's subtasks form one *barrier* stage (gang scheduling, see ``jobs._driver``): this
module sets how long Spark checks for enough task slots before it gives up
(``slot_error`` turns that failure into one line), how often a failed barrier stage is
restarted, where the driver listens, and ``spark.authenticate``.
"""

from __future__ import annotations

import logging
import math
import os
import re
import shutil
import signal
import socket
import sys
import threading
from pathlib import Path
from typing import Any

from enumerator_service import ConfigError, Settings

__all__ = ["auth_secret", "get_spark", "slot_error", "spark_for", "task_slots"]

_log = logging.getLogger(__name__)

#: Seconds between Spark's checks that a barrier stage's tasks fit into the free task slots.
_SLOT_CHECK_INTERVAL = 1.0


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
    connect back to the driver at ``driver_host`` (default: this machine's host name, which
    is the service name under docker compose); the driver binds exactly that address, never
    every interface, so it is reachable on the network executors use and nowhere else.
    """
    if master.startswith("local"):
        return driver_host or "127.0.0.1", driver_host or "127.0.0.1"
    host = driver_host or socket.gethostname()
    return host, host


def auth_secret(settings: Settings) -> str | None:
    """The ``spark.authenticate`` secret: ``SLUICE_SPARK_AUTH_SECRET``, or the contents of
    ``SLUICE_SPARK_AUTH_SECRET_FILE`` (without its trailing newline). ConfigError when both
    are set, or the file cannot be read or is empty; the secret never appears in it."""
    secret, path = settings.spark_auth_secret, settings.spark_auth_secret_file
    if secret is not None and path is not None:
        raise ConfigError(
            "SLUICE_SPARK_AUTH_SECRET_FILE", "set either it or SLUICE_SPARK_AUTH_SECRET, not both"
        )
    if path is not None:
        try:
            value = path.read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError) as exc:
            reason = exc.strerror if isinstance(exc, OSError) else "not UTF-8 text"
            raise ConfigError("SLUICE_SPARK_AUTH_SECRET_FILE", f"{path}: {reason}") from None
        if not value:
            raise ConfigError("SLUICE_SPARK_AUTH_SECRET_FILE", f"{path} is empty")
        return value
    if secret is not None:
        value = secret.get_secret_value()
        if not value.strip():
            raise ConfigError("SLUICE_SPARK_AUTH_SECRET", "must not be empty")
        return value
    return None


def _own_sigint_handler() -> Any:
    """The SIGINT handler the caller installed (None: Python's default, or not the main
    thread, where PySpark installs none)."""
    if threading.current_thread() is not threading.main_thread():
        return None
    handler = signal.getsignal(signal.SIGINT)
    if handler in (None, signal.SIG_DFL, signal.SIG_IGN, signal.default_int_handler):
        return None
    return handler


def spark_for(settings: Settings, *, app_name: str = "sluice") -> Any:
    """The SparkSession for ``settings`` (master, driver address, authentication, slots)."""
    return get_spark(
        settings.spark_master,
        app_name=app_name,
        driver_host=settings.spark_driver_host,
        secret=auth_secret(settings),
        slot_wait_seconds=settings.spark_slot_wait_seconds,
    )


def task_slots(spark: Any) -> int | None:
    """How many tasks the application can run at once now (None if Spark does not say)."""
    try:
        sc = spark.sparkContext._jsc.sc()
        return int(sc.maxNumConcurrentTasks(sc.resourceProfileManager().defaultResourceProfile()))
    except Exception:  # only for a message; Spark internals may change
        return None


def slot_error(exc: BaseException, spark: Any, subtasks: int, master: str) -> ConfigError | None:
    """ConfigError naming SLUICE_PARALLELISM if ``exc`` is Spark's "a barrier stage needs more
    task slots than the cluster has" (after its checks for ``spark_slot_wait_seconds``)."""
    if "BarrierJobSlotsNumberCheckFailed" not in str(exc):
        return None
    slots = task_slots(spark)
    have = "fewer" if slots is None else str(slots)
    return ConfigError(
        "SLUICE_PARALLELISM",
        f"{subtasks} subtasks must run at once, but the Spark application on {master} has "
        f"{have} task slots; lower SLUICE_PARALLELISM or give Spark more cores",
    )


def get_spark(
    master: str,
    *,
    app_name: str = "sluice",
    task_attempts: int = 4,
    driver_host: str | None = None,
    secret: str | None = None,
    slot_wait_seconds: float = 30.0,
) -> Any:
    """Get or create the SparkSession; Python workers use this very interpreter.

    ``task_attempts`` bounds both a plain task's attempts and the restarts of a failed
    barrier stage (``spark.stage.maxConsecutiveAttempts``). A barrier stage waits up to
    ``slot_wait_seconds`` for enough task slots on a cluster master (executors register after
    the application starts); a local master's slots are fixed, so it fails after one check.
    ``secret``: turn ``spark.authenticate`` on with this shared secret.
    """
    _check_java()
    # Workers must run the driver's interpreter (the virtualenv), not python3 from PATH.
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    host, bind = _driver_addresses(master, driver_host)
    local = master.startswith("local")
    slot_checks = 1 if local else max(1, math.ceil(slot_wait_seconds / _SLOT_CHECK_INTERVAL))
    if secret is None and not local:
        _log.warning(
            "Spark master %s without spark.authenticate: anyone who reaches the driver or the "
            "cluster can run code in it; set SLUICE_SPARK_AUTH_SECRET(_FILE)",
            master,
        )

    builder = (
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
        # Workers are forked from a daemon that imported the subtask's modules (see _daemon).
        .config("spark.python.daemon.module", "spark_jobs._daemon")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.extraJavaOptions", f"-Dlog4j2.configurationFile={_LOG4J.as_uri()}")
        # Gang scheduling (barrier stages): check for enough slots every second, give up after
        # slot_checks failed checks; a failed barrier stage is restarted as a whole.
        .config("spark.scheduler.barrier.maxConcurrentTasksCheck.interval", "1s")
        .config("spark.scheduler.barrier.maxConcurrentTasksCheck.maxFailures", str(slot_checks))
        .config("spark.stage.maxConsecutiveAttempts", str(task_attempts))
        # Spark refuses barrier stages under dynamic allocation (a spark-defaults.conf might
        # turn it on): a run's executors are fixed for its lifetime.
        .config("spark.dynamicAllocation.enabled", "false")
    )
    if secret is not None:
        # Spark redacts "secret" settings in its UI and logs (spark.redaction.regex).
        builder = builder.config("spark.authenticate", "true").config(
            "spark.authenticate.secret", secret
        )
    # PySpark's context replaces the process's SIGINT handler with its own, which calls
    # Py4J from inside the signal handler (while the main thread may be in a Py4J call: a
    # page of "reentrant call" tracebacks). A handler the caller installed (the CLI's: it
    # raises KeyboardInterrupt and the run cancels its job itself) is put back.
    caller_handler = _own_sigint_handler()
    try:
        spark = builder.getOrCreate()
    except Exception as exc:
        if local:
            raise
        # Spark gives up after three 20 s registration attempts with an unhelpful error.
        raise ConfigError(
            "SLUICE_SPARK_MASTER",
            f"no Spark application could start on {master}: the master is unreachable or "
            "refused it (check the address, and that SLUICE_SPARK_AUTH_SECRET(_FILE) matches "
            "the cluster's spark.authenticate.secret)",
        ) from exc
    if caller_handler is not None:
        signal.signal(signal.SIGINT, caller_handler)
    spark.sparkContext.setLogLevel("ERROR")
    return spark
