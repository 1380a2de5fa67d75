"""A checkpoint coordinator's counterpart for tests on a real Postgres: a run whose subtasks
the test plays (``Run.ack`` acknowledges through the same ``acknowledge()`` the reader tasks
use) and a sink that records what the completion protocol did with it (``RecordingSink``).
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable, Sequence
from datetime import date
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from enumerator_service import (
    Acknowledgement,
    FileSplit,
    SplitAssignment,
    SplitStore,
    StagedTransaction,
    acknowledge,
)
from enumerator_service._checkpoint_store import encode_dead_letters
from enumerator_service._operations import Platform
from enumerator_service._schema import checkpoints, sink_transactions, splits
from spark_jobs.checkpoint import CheckpointCoordinator

__all__ = ["RecordingSink", "Run", "forget_recorded", "status", "wait_until"]


class RecordingSink:
    """Commit side of a sink that records what happened, and when (inside the transaction
    or after it)."""

    name = "recording"

    def __init__(self) -> None:
        self.events: list[tuple[str, list[int]]] = []

    def commit(self, conn: Connection, txns: Sequence[StagedTransaction]) -> None:
        assert conn.in_transaction()
        self.events.append(("commit", sorted(t.checkpoint_id for t in txns)))

    def publish(self, txns: Sequence[StagedTransaction]) -> None:
        self.events.append(("publish", sorted(t.checkpoint_id for t in txns)))

    def abort(self, txns: Sequence[StagedTransaction]) -> None:
        self.events.append(("abort", sorted(t.checkpoint_id for t in txns)))


def wait_until(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        time.sleep(0.02)


def forget_recorded(platform: Platform) -> None:
    """Delete the test's sink transactions of kind ``recording`` (a test's teardown): a later
    recovery in the same database (another test's run, in a process where no
    ``RecordingSink`` is registered) would otherwise find them unpublished and fail."""
    with platform.engine.begin() as conn:
        conn.execute(sa.delete(sink_transactions).where(sink_transactions.c.sink == "recording"))


def status(platform: Platform, run_id: str, checkpoint_id: int) -> str | None:
    with platform.engine.connect() as conn:
        return conn.execute(
            sa.select(checkpoints.c.status).where(
                checkpoints.c.run_id == run_id, checkpoints.c.checkpoint_id == checkpoint_id
            )
        ).scalar_one_or_none()


class Run:
    """A run with one pulled split per subtask."""

    def __init__(self, platform: Platform, subtasks: int = 2) -> None:
        self.platform = platform
        self.run_id = f"run-{secrets.token_hex(4)}"
        self.store = SplitStore(platform.engine)
        source = platform.settings.source_name
        self.store.register(
            FileSplit(
                source, "jsonl", f"/landing/{self.run_id}-{i}.jsonl", 0, 1000, date(2026, 1, 1)
            )
            for i in range(subtasks)
        )
        self.store.assign_to_run(self.run_id, source, lease_seconds=60)
        held = [self.store.pull_next(self.run_id, k, 60) for k in range(subtasks)]
        assert all(a is not None for a in held)
        self.held: list[SplitAssignment] = [a for a in held if a is not None]

    def ack(
        self,
        checkpoint_id: int,
        subtask: int,
        *,
        offset: int = 100,
        finished: bool = False,
        final: bool = False,
        attempt: str = "a1",
        epoch: int | None = None,
        rows: int = 10,
        pending: list[Any] | None = None,
        dead: list[tuple[int, int, bytes, str]] | None = None,
        two_phase: bool = True,
    ) -> None:
        split = self.held[subtask]
        state = {
            "id": split.split_id,
            "epoch": split.epoch if epoch is None else epoch,
            "offset": offset,
            "watermark": "2026-01-01T00:00:00+00:00",
            "finished": finished,
            "pending": pending or [],
        }
        acknowledge(
            self.platform.engine,
            Acknowledgement(
                run_id=self.run_id,
                checkpoint_id=checkpoint_id,
                subtask=subtask,
                attempt=attempt,
                final=final,
                snapshot={"splits": [state]},
                sink="recording",
                staged=[{"batch": f"{subtask}-{attempt}-{checkpoint_id}"}] if rows else [],
                row_count=rows,
                dead_letters=encode_dead_letters(dead or []),
            ),
            two_phase=two_phase,
        )

    def split_row(self, subtask: int) -> Any:
        with self.platform.engine.connect() as conn:
            return conn.execute(
                sa.select(splits).where(splits.c.id == self.held[subtask].split_id)
            ).one()

    def txns(self) -> list[Any]:
        with self.platform.engine.connect() as conn:
            return conn.execute(
                sa.select(sink_transactions)
                .where(sink_transactions.c.run_id == self.run_id)
                .order_by(sink_transactions.c.checkpoint_id, sink_transactions.c.subtask)
            ).all()

    def coordinator(
        self, sink: RecordingSink, *, interval: float = 0.1, timeout: float = 10.0, **kw: Any
    ) -> CheckpointCoordinator:
        coordinator = CheckpointCoordinator(
            self.platform.engine,
            self.run_id,
            len(self.held),
            {sink.name: sink},
            interval=interval,
            timeout=timeout,
            **kw,
        )
        coordinator.start()
        return coordinator
