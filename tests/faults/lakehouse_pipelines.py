"""The clickstream and orders examples with a lakehouse sink (the module named in
``SLUICE_PIPELINES`` by ``test_lakehouse_faults.py``; importable as
``tests.faults.lakehouse_pipelines`` with the repository on ``PYTHONPATH``).

- ``clickstream_delta`` / ``orders_delta``: the examples with their sink replaced by the real
  ``DeltaSink`` (append; orders: ``upsert_key=["order_id"]``, merged by key).
- ``clickstream_delta_kill``: the clickstream with :class:`KillingDeltaSink`, the real Delta
  connector under another name whose committer wraps the real ``DeltaCommitter`` and SIGKILLs
  its own process (the run's driver: publish runs on its coordinator) at a chosen point of
  the N-th publish that has files — ``SLUICE_TEST_KILL_AT`` = ``before:N`` (the files are
  staged and the checkpoint committed in Postgres; no Delta commit yet) or ``after:N`` (the
  Delta commit is made; the transactions are not marked published). Unset: it never kills,
  so a plain re-run of the same pipeline is the recovery under test. No product code knows.

The Iceberg sink (branch ``wip-iceberg``) is one more entry of ``SINKS`` once it lands.

Threading: the killing committer's counter is touched only by the coordinator thread (and a
recovery, which runs before it, in the same thread); a plain int suffices.
"""

from __future__ import annotations

import dataclasses
import os
import signal
from collections.abc import Mapping, Sequence

from sqlalchemy.engine import Connection, Engine

import examples.clickstream as _clickstream
import examples.orders as _orders
from enumerator_service import StagedTransaction, StorageOptions, TransactionalSink
from spark_jobs import DeltaSink, Pipeline
from spark_jobs.connectors import register_sink
from spark_jobs.connectors.delta import DeltaCommitter, DeltaConnector

__all__ = [
    "KILL_SETTING",
    "KillingDeltaSink",
    "clickstream_delta",
    "clickstream_delta_kill",
    "orders_delta",
]

#: ``before:N`` | ``after:N``: where the N-th publish with files kills the driver.
KILL_SETTING = "SLUICE_TEST_KILL_AT"
#: The table folders (relative to ``SLUICE_WAREHOUSE_DIR``).
CLICKSTREAM_TABLE = "lake/enriched_events"
ORDERS_TABLE = "lake/orders_enriched"
KILL_TABLE = "lake/enriched_events_kill"


@dataclasses.dataclass(frozen=True)
class KillingDeltaSink(DeltaSink):
    """A ``DeltaSink`` whose connector kills the driver at ``SLUICE_TEST_KILL_AT``."""


class KillingDeltaCommitter:
    """The real ``DeltaCommitter``, with a SIGKILL of this process around the N-th publish
    that has files (``before``: ahead of the Delta commit; ``after``: once it returned)."""

    def __init__(self, real: DeltaCommitter, name: str) -> None:
        self._real = real
        self.name = name
        self._publishes = 0

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
        self._real.publish(txns)
        if armed and point == "after":
            os.kill(os.getpid(), signal.SIGKILL)


class KillingDeltaConnector(DeltaConnector):
    """The Delta connector (another name: one connector per name in the registry)."""

    name = "delta_kill"

    def committers(
        self, engine: Engine | None, storage: StorageOptions | None = None
    ) -> Mapping[str, TransactionalSink]:
        return {self.name: KillingDeltaCommitter(DeltaCommitter(engine, storage), self.name)}


register_sink(KillingDeltaSink, KillingDeltaConnector())

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
