"""The clickstream and orders examples with a lakehouse sink (the module named in
``SLUICE_PIPELINES`` by ``test_lakehouse_faults.py``; importable as
``tests.faults.lakehouse_pipelines`` with the repository on ``PYTHONPATH``).

- ``clickstream_delta`` / ``orders_delta``: the examples with their sink replaced by the real
  ``DeltaSink`` (append; orders: ``upsert_key=["order_id"]``, merged by key).
- ``clickstream_delta_kill`` / ``orders_delta_kill``: the clickstream (the orders) with
  :class:`KillingDeltaSink`, the real Delta connector under another name whose committer
  wraps the real ``DeltaCommitter`` and SIGKILLs its own process (the run's driver: publish
  runs on its coordinator) at a chosen point of the N-th publish that has files —
  ``SLUICE_TEST_KILL_AT`` = ``before:N`` (the files are staged and the checkpoint committed
  in Postgres; no Delta commit yet) or ``after:N`` (the Delta commit is made; the
  transactions are not marked published). Unset: it never kills, so a plain re-run of the
  same pipeline is the recovery under test. No product code knows.
  With ``SLUICE_TEST_KILL_WORKER`` = a flag file's path, the first Spark Python worker whose
  pre-commit staged files (closed, verified) creates the flag and SIGKILLs itself before the
  pre-commit is acknowledged: its files stay in the table folder, named by no transaction
  and no log entry (the orphans the maintenance removes).
  With ``SLUICE_TEST_CRASH_PG`` = ``<pg_ctl>|<data folder>|<socket folder>|<user>`` (the
  test's own server), the first publish of a checkpoint that carries one subtask's final
  acknowledgement and another's non-final one crashes Postgres (immediate stop) once its
  table commit returned — before the transactions are marked published, as a crash under
  the table lock's unlock — and starts it again 1.5 s later, outside the run's session
  (the hang of the orders-delta fault case).

- ``clickstream_iceberg`` / ``orders_iceberg`` / ``clickstream_iceberg_kill``: the same with
  the real ``IcebergSink`` (Sluice's catalog in the platform database; namespace ``faults``).

Threading: the dying writer's pre-commit runs on the task's mailbox thread (it waits for the
writer thread's close, as the acknowledgement would); the killing committer's counter is
touched only by the coordinator thread (a recovery runs before it, in the same thread).
"""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import threading
from collections.abc import Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

import examples.clickstream as _clickstream
import examples.orders as _orders
from enumerator_service import StagedTransaction, StorageOptions, TransactionalSink
from spark_jobs import DeltaSink, IcebergSink, Pipeline
from spark_jobs.connectors import SinkWriterContext, register_sink
from spark_jobs.connectors.delta import DeltaCommitter, DeltaConnector
from spark_jobs.connectors.iceberg import IcebergCommitter, IcebergConnector
from spark_jobs.sink import StagedOutput

if TYPE_CHECKING:
    from spark_jobs.pipeline._plan import SinkPlan

__all__ = [
    "CRASH_PG_SETTING",
    "KILL_SETTING",
    "WORKER_KILL_SETTING",
    "KillingDeltaSink",
    "KillingIcebergSink",
    "clickstream_delta",
    "clickstream_delta_kill",
    "clickstream_iceberg",
    "clickstream_iceberg_kill",
    "orders_delta",
    "orders_delta_kill",
    "orders_iceberg",
]

#: ``before:N`` | ``after:N``: where the N-th publish with files kills the driver.
KILL_SETTING = "SLUICE_TEST_KILL_AT"
#: A flag file: the first worker that creates it dies after staging files.
WORKER_KILL_SETTING = "SLUICE_TEST_KILL_WORKER"
#: ``<pg_ctl>|<data folder>|<socket folder>|<user>``: crash Postgres under a final publish.
CRASH_PG_SETTING = "SLUICE_TEST_CRASH_PG"
#: The table folders (relative to ``SLUICE_WAREHOUSE_DIR``).
CLICKSTREAM_TABLE = "lake/enriched_events"
ORDERS_TABLE = "lake/orders_enriched"
KILL_TABLE = "lake/enriched_events_kill"
ORDERS_KILL_TABLE = "lake/orders_enriched_kill"


@dataclasses.dataclass(frozen=True)
class KillingDeltaSink(DeltaSink):
    """A ``DeltaSink`` whose connector kills the driver at ``SLUICE_TEST_KILL_AT``."""


@dataclasses.dataclass(frozen=True)
class KillingIcebergSink(IcebergSink):
    """An ``IcebergSink`` whose connector kills the driver at ``SLUICE_TEST_KILL_AT``."""


class KillingCommitter:
    """A real committer (``DeltaCommitter``, ``IcebergCommitter``), with a SIGKILL of this
    process around the N-th publish that has files (``before``: ahead of the table commit;
    ``after``: once it returned)."""

    def __init__(self, real: TransactionalSink, name: str, engine: Engine | None = None) -> None:
        self._real = real
        self.name = name
        self._engine = engine
        self._publishes = 0
        self._crashed = False

    def commit(self, conn: Connection, txns: Sequence[StagedTransaction]) -> None:
        self._real.commit(conn, txns)

    def abort(self, txns: Sequence[StagedTransaction]) -> None:
        self._real.abort(txns)

    def publish(self, txns: Sequence[StagedTransaction]) -> None:
        point, _, nth = os.environ.get(KILL_SETTING, "").partition(":")
        if any(t.staged for t in txns):
            self._publishes += 1
        armed = bool(point) and any(t.staged for t in txns) and self._publishes == int(nth)
        if armed and point == "before":
            os.kill(os.getpid(), signal.SIGKILL)
        crash = self._crash_point(txns)
        self._real.publish(txns)
        if armed and point == "after":
            os.kill(os.getpid(), signal.SIGKILL)
        if crash:
            _crash_postgres(os.environ[CRASH_PG_SETTING])

    def _crash_point(self, txns: Sequence[StagedTransaction]) -> bool:
        """Whether this publish crashes Postgres (``SLUICE_TEST_CRASH_PG``, once)."""
        if self._crashed or not os.environ.get(CRASH_PG_SETTING) or self._engine is None:
            return False
        with self._engine.connect() as conn:
            # A subtask's final acknowledgement while another subtask goes on.
            one_of = conn.execute(
                sa.text(
                    "SELECT bool_or(final) AND NOT bool_and(final) FROM sluice.checkpoint_acks"
                    " WHERE run_id = :run AND checkpoint_id = :id"
                ),
                {"run": txns[0].run_id, "id": max(t.checkpoint_id for t in txns)},
            ).scalar_one()
        self._crashed = bool(one_of)
        return self._crashed


def _crash_postgres(spec: str) -> None:
    """Immediate stop of the test's Postgres now, a start 1.5 s later (its own session: the
    harness kills whatever of a run's session outlives the run)."""
    pg_ctl, data, sockets, user = spec.split("|")
    quiet = subprocess.DEVNULL
    stop = [pg_ctl, "-D", data, "-m", "immediate", "-w", "stop"]
    subprocess.run(stop, check=True, timeout=60, stdout=quiet, stderr=quiet, user=user or None)
    start = [pg_ctl, "-D", data, "-w", "-o", f'-h "" -k {sockets}', "-l", f"{data}/log", "start"]

    def restart() -> None:
        subprocess.run(
            start,
            timeout=60,
            start_new_session=True,
            stdout=quiet,
            stderr=quiet,
            user=user or None,
        )

    threading.Timer(1.5, restart).start()


class DyingWriter:
    """The real task-side writer; its pre-commit kills the worker once files are staged,
    the first time in the whole test (the flag file, created exclusively, says who)."""

    def __init__(self, real: Any, flag: str) -> None:
        self._real = real
        self._flag = flag

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)

    def pre_commit(self) -> Future[StagedOutput]:
        future: Future[StagedOutput] = self._real.pre_commit()
        if future.result().files and _claim(self._flag):
            os.kill(os.getpid(), signal.SIGKILL)
        return future


def _dying(writer: Any) -> Any:
    """``writer``, or a ``DyingWriter`` of it when ``SLUICE_TEST_KILL_WORKER`` names a flag."""
    flag = os.environ.get(WORKER_KILL_SETTING)
    return DyingWriter(writer, flag) if flag else writer


def _claim(flag: str) -> bool:
    try:
        os.close(os.open(flag, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return False
    return True


class KillingDeltaConnector(DeltaConnector):
    """The Delta connector (another name: one connector per name in the registry)."""

    name = "delta_kill"

    def open_writer(
        self, plan: SinkPlan, io: ThreadPoolExecutor, context: SinkWriterContext
    ) -> Any:
        return _dying(super().open_writer(plan, io, context))

    def committers(
        self, engine: Engine | None, storage: StorageOptions | None = None
    ) -> Mapping[str, TransactionalSink]:
        return {self.name: KillingCommitter(DeltaCommitter(engine, storage), self.name, engine)}


class KillingIcebergConnector(IcebergConnector):
    """The Iceberg connector (another name), its committer wrapped likewise."""

    name = "iceberg_kill"

    def open_writer(
        self, plan: SinkPlan, io: ThreadPoolExecutor, context: SinkWriterContext
    ) -> Any:
        return _dying(super().open_writer(plan, io, context))

    def committers(
        self, engine: Engine | None, storage: StorageOptions | None = None
    ) -> Mapping[str, TransactionalSink]:
        return {self.name: KillingCommitter(IcebergCommitter(engine, storage), self.name)}


register_sink(KillingDeltaSink, KillingDeltaConnector())
register_sink(KillingIcebergSink, KillingIcebergConnector())

clickstream_delta: Pipeline = dataclasses.replace(
    _clickstream.clickstream,
    name="clickstream_delta",
    description="The clickstream example into a Delta table.",
    sink=DeltaSink(CLICKSTREAM_TABLE),
)

clickstream_delta_kill: Pipeline = dataclasses.replace(
    _clickstream.clickstream,
    name="clickstream_delta_kill",
    description="The clickstream example into a Delta table; the driver dies at a publish.",
    sink=KillingDeltaSink(KILL_TABLE),
)

orders_delta: Pipeline = dataclasses.replace(
    _orders.orders,
    name="orders_delta",
    description="The orders example merged into a Delta table by order id.",
    sink=DeltaSink(ORDERS_TABLE, upsert_key=["order_id"]),
)

orders_delta_kill: Pipeline = dataclasses.replace(
    _orders.orders,
    name="orders_delta_kill",
    description="The orders example merged into a Delta table; faults at a publish.",
    sink=KillingDeltaSink(ORDERS_KILL_TABLE, upsert_key=["order_id"]),
)

clickstream_iceberg: Pipeline = dataclasses.replace(
    _clickstream.clickstream,
    name="clickstream_iceberg",
    description="The clickstream example into an Iceberg table.",
    sink=IcebergSink("faults.enriched_events"),
)

clickstream_iceberg_kill: Pipeline = dataclasses.replace(
    _clickstream.clickstream,
    name="clickstream_iceberg_kill",
    description="The clickstream example into an Iceberg table; the driver dies at a publish.",
    sink=KillingIcebergSink("faults.enriched_events_kill"),
)

orders_iceberg: Pipeline = dataclasses.replace(
    _orders.orders,
    name="orders_iceberg",
    description="The orders example upserted into an Iceberg table by order id.",
    sink=IcebergSink("faults.orders_enriched", upsert_key=["order_id"]),
)
