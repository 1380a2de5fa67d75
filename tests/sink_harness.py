"""Shared by the sink tests: an output schema with the types pipelines derive (decimals,
dates, booleans, int32, a mixed-case and a reserved-word field), its batches, and a run that
holds one split and drives the real checkpoint protocol for its subtask 0.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from decimal import Decimal
from typing import Any

import pyarrow as pa
import sqlalchemy as sa

from enumerator_service import (
    AbortCause,
    Acknowledgement,
    CheckpointStore,
    FileSplit,
    SplitAssignment,
    SplitStore,
    acknowledge,
)
from enumerator_service._operations import Platform
from enumerator_service._schema import sink_transactions
from spark_jobs.sink import PostgresTableSink, StagedOutput, build_sinks

__all__ = [
    "COLUMNS",
    "DAY1",
    "DAY2",
    "ORDERS",
    "Run",
    "expected",
    "orders",
    "refuse_batch_tables",
]

DAY1, DAY2 = date(2026, 1, 1), date(2026, 1, 2)
ORDERS = pa.schema(
    [
        pa.field("order_id", pa.int64()),
        pa.field("Customer", pa.string()),
        pa.field("order", pa.int32()),
        pa.field("total", pa.decimal128(12, 2)),
        pa.field("paid", pa.bool_()),
        pa.field("placed_at", pa.timestamp("us", tz="UTC")),
        pa.field("day", pa.date32()),
    ]
)
COLUMNS = 'order_id, "Customer", "order", total, paid, placed_at, day'


def orders(*rows: tuple[int, str, int, str], schema: pa.Schema = ORDERS) -> pa.RecordBatch:
    """(order_id, Customer, order, total) rows; the other fields follow from them."""
    return pa.RecordBatch.from_pylist(
        [
            {
                "order_id": oid,
                "Customer": customer,
                "order": order,
                "total": Decimal(total),
                "paid": oid % 2 == 0,
                "placed_at": datetime(2026, 1, 1, 12, oid % 60, tzinfo=UTC),
                "day": DAY1,
            }
            for oid, customer, order, total in rows
        ],
        schema=schema,
    )


def expected(batch: pa.RecordBatch) -> list[tuple[Any, ...]]:
    return [tuple(row.values()) for row in batch.to_pylist()]


@dataclass
class Run:
    """A run holding one pulled split, acknowledging checkpoints as its subtask 0."""

    platform: Platform
    sink: str
    run_id: str = field(default_factory=lambda: f"run-{secrets.token_hex(4)}")
    offset: int = 0

    def __post_init__(self) -> None:
        self.store = SplitStore(self.platform.engine)
        source = self.platform.settings.source_name
        uri = f"/landing/{self.run_id}.jsonl"
        self.store.register([FileSplit(source, "jsonl", uri, 0, 10_000, DAY1)])
        self.store.assign_to_run(self.run_id, source, lease_seconds=60)
        held = self.store.pull_next(self.run_id, 0, 60)
        assert held is not None
        self.held: SplitAssignment = held
        self.checkpoints = CheckpointStore(
            self.platform.engine, self.run_id, build_sinks(self.platform.engine)
        )

    def ack(self, checkpoint_id: int, out: StagedOutput, *, two_phase: bool = True) -> None:
        self.offset += 100
        state = {
            "id": self.held.split_id,
            "epoch": self.held.epoch,
            "offset": self.offset,
            "watermark": None,
            "finished": False,
            "pending": [],
        }
        acknowledge(
            self.platform.engine,
            Acknowledgement(
                run_id=self.run_id,
                checkpoint_id=checkpoint_id,
                subtask=0,
                attempt="a1",
                final=False,
                snapshot={"splits": [state]},
                sink=self.sink,
                staged=out.files,
                row_count=out.rows,
                dead_letters=out.dead_letters,
                dropped=out.dropped,
            ),
            two_phase=two_phase,
            sink=None if two_phase else PostgresTableSink(),
        )

    def checkpoint(self, checkpoint_id: int, out: StagedOutput, *, complete: bool = True) -> None:
        """Trigger, acknowledge with ``out``, then complete (or abort) the checkpoint."""
        self.checkpoints.trigger(checkpoint_id)
        self.ack(checkpoint_id, out)
        if complete:
            assert self.checkpoints.complete(checkpoint_id, two_phase=True) is not None
        else:
            self.checkpoints.abort(checkpoint_id, AbortCause.TIMEOUT, "test")

    def dropped(self) -> list[int]:
        with self.platform.engine.connect() as conn:
            return list(
                conn.execute(
                    sa.select(sink_transactions.c.dropped_count)
                    .where(sink_transactions.c.run_id == self.run_id)
                    .order_by(sink_transactions.c.checkpoint_id)
                ).scalars()
            )


def refuse_batch_tables(schema: str, function: str) -> str:
    """SQL of an event trigger that puts a ``BEFORE INSERT`` trigger running ``function``
    (a trigger function that may raise) on every staged batch table created in ``schema``:
    a batch table only exists from its batch's first COPY. Dropped by ``DROP EVENT TRIGGER
    refuse_batch_tables``."""
    return f"""
CREATE OR REPLACE FUNCTION {schema}.arm_refusal() RETURNS event_trigger LANGUAGE plpgsql AS $$
DECLARE created record;
BEGIN
    FOR created IN SELECT * FROM pg_event_trigger_ddl_commands()
        WHERE command_tag = 'CREATE TABLE' AND schema_name = '{schema}'
        AND starts_with(object_identity, '{schema}.__sluice_staged_')
    LOOP
        EXECUTE 'CREATE TRIGGER refuse BEFORE INSERT ON ' || created.object_identity
            || ' FOR EACH ROW EXECUTE FUNCTION {function}()';
    END LOOP;
END $$;
DROP EVENT TRIGGER IF EXISTS refuse_batch_tables;
CREATE EVENT TRIGGER refuse_batch_tables ON ddl_command_end WHEN TAG IN ('CREATE TABLE')
    EXECUTE FUNCTION {schema}.arm_refusal();
"""
