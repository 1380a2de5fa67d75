"""A deterministic error stops the whole run at once, without Spark's stage retries.

Spark retries a failed barrier stage (``spark.stage.maxConsecutiveAttempts``) whatever the
error: right for a lost executor or connection, useless for a ``Map`` that returns a string
for a double — every attempt reads the same records and fails the same way, and each adds
a page of Py4J and Python traceback. So a subtask that hits a deterministic error
(:func:`~spark_jobs.jobs._user_errors.deterministic_error`) does not raise it into Spark:
it tells the driver (a ``failed`` notification on the coordinator's channel, with the one
line), and waits. The coordinator hears it and cancels the job — a cancelled job is not
retried — and the driver fails the run with
:class:`~spark_jobs._outcomes.DeterministicFailure`, whose text is that line. Should the
notification be lost (the database restarting just then), the subtask raises after
:data:`WAIT_FOR_CANCEL` seconds and Spark's retries take over, as for any failure.
"""

from __future__ import annotations

import json
import logging
import time

import sqlalchemy as sa

from enumerator_service import COORDINATOR_CHANNEL, connect_engine
from spark_jobs.jobs._task_config import TaskConfig

__all__ = ["FAILED_EVENT", "WAIT_FOR_CANCEL", "stop_the_run"]

_log = logging.getLogger(__name__)

#: The coordinator-channel event of a subtask that hit a deterministic error.
FAILED_EVENT = "failed"
#: Seconds a failed subtask waits for the driver to cancel the job before it raises.
WAIT_FOR_CANCEL = 30.0
#: A NOTIFY payload is at most 8000 bytes.
_MAX_LINE = 2000


def stop_the_run(config: TaskConfig, subtask: int, line: str) -> None:
    """Tell the driver that subtask ``subtask`` hit the deterministic error ``line``, then
    wait (up to :data:`WAIT_FOR_CANCEL` seconds) for the job to be cancelled."""
    payload = json.dumps(
        {"run": config.run_id, "event": FAILED_EVENT, "subtask": subtask, "error": line[:_MAX_LINE]}
    )
    try:
        engine = connect_engine(config.database_url, pool_size=1)
        try:
            with engine.begin() as conn:
                conn.execute(sa.select(sa.func.pg_notify(COORDINATOR_CHANNEL, payload)))
        finally:
            engine.dispose()
    except Exception as exc:  # the error itself is raised by the caller
        _log.warning("subtask %d: could not tell the driver to stop (%s)", subtask, exc)
        return
    deadline = time.monotonic() + WAIT_FOR_CANCEL
    while time.monotonic() < deadline:
        time.sleep(0.2)  # Spark kills this task when the driver cancels the job
