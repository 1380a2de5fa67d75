"""Parquet output of enriched events, staged per split and committed with the split's state.

Commit protocol of one split (the committer thread runs it; the mailbox thread never blocks):
the staged file and the database transaction make publication idempotent, so a crash at any
step never loses or duplicates committed output (see ``SplitCommitter.commit``).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.engine import Engine

from enumerator_service import FencedError, SplitAssignment, SplitState, SplitStore
from enumerator_service._schema import dead_letters, sink_transactions

__all__ = [
    "ENRICHED_SCHEMA",
    "CommitResult",
    "SplitCommitter",
    "SplitOutput",
    "final_path",
    "publish_pending",
]

ENRICHED_SCHEMA = pa.schema(
    [
        pa.field("event_id", pa.string(), nullable=False),
        pa.field("user_id", pa.int64(), nullable=False),
        pa.field("event_time", pa.timestamp("us", tz="UTC"), nullable=False),
        pa.field("event_type", pa.string(), nullable=False),
        pa.field("amount", pa.float64(), nullable=False),
        pa.field("user_name", pa.string()),
        pa.field("user_country", pa.string()),
        pa.field("user_tier", pa.string()),
        pa.field("user_signup_time", pa.timestamp("us", tz="UTC")),
    ]
)
_MAX_RAW = 4096


@dataclass(slots=True)
class SplitOutput:
    """Everything one split produced, gathered on the mailbox thread until it is committed."""

    assignment: SplitAssignment
    state: SplitState
    rows: list[tuple[Any, ...]] = field(default_factory=list)
    dead: list[tuple[int, bytes, str]] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class CommitResult:
    split_id: int
    rows: int
    dead_letters: int
    fenced: bool
    path: str


def final_path(output_root: Path, assignment: SplitAssignment) -> Path:
    """Deterministic per split: re-publishing overwrites, it can never add a second copy."""
    day = assignment.split.partition_key
    folder = f"dt={day.isoformat()}" if day is not None else "dt=__unknown__"
    return output_root / folder / f"part-s{assignment.split_id:09d}.parquet"


class SplitCommitter:
    """Stages, commits and publishes split outputs. Blocking: call from a committer thread."""

    def __init__(
        self, engine: Engine, *, run_id: str, subtask: int, output_root: Path, staging_root: Path
    ) -> None:
        self._engine = engine
        self._run_id = run_id
        self._subtask = subtask
        self._output = output_root
        self._staging = staging_root / run_id

    def commit(self, out: SplitOutput) -> CommitResult:
        assignment = out.assignment
        target = final_path(self._output, assignment)
        staged = self._staging / f"s{assignment.split_id:09d}-e{assignment.epoch}.parquet"

        # Step 1: pre-commit — write the split's rows to a staged file nobody reads.
        staged.parent.mkdir(parents=True, exist_ok=True)
        columns: list[Sequence[Any]] = [()] * len(ENRICHED_SCHEMA)
        if out.rows:
            columns = list(zip(*out.rows, strict=True))
        table = pa.Table.from_arrays(
            [pa.array(col, type=f.type) for col, f in zip(columns, ENRICHED_SCHEMA, strict=True)],
            schema=ENRICHED_SCHEMA,
        )
        pq.write_table(table, staged, compression="zstd")

        # Step 2: commit — one transaction fences the epoch, completes the split, records the
        # sink transaction and the dead letters. Nothing is visible before it commits.
        try:
            with self._engine.begin() as conn:
                SplitStore.complete(
                    conn, assignment, self._run_id, out.state.offset, out.state.watermark
                )
                txn_id = conn.execute(
                    insert(sink_transactions)
                    .values(
                        run_id=self._run_id,
                        subtask=self._subtask,
                        split_id=assignment.split_id,
                        epoch=assignment.epoch,
                        staged_path=str(staged),
                        final_path=str(target),
                        row_count=len(out.rows),
                        committed=True,
                        committed_at=sa.func.now(),
                    )
                    .returning(sink_transactions.c.id)
                ).scalar_one()
                if out.dead:
                    split = assignment.split
                    conn.execute(
                        insert(dead_letters)
                        .values(
                            [
                                {
                                    "split_id": assignment.split_id,
                                    "source": split.source,
                                    "uri": split.path,
                                    "offset": offset,
                                    "raw": raw[:_MAX_RAW],
                                    "reason": reason,
                                    "run_id": self._run_id,
                                }
                                for offset, raw, reason in out.dead
                            ]
                        )
                        .on_conflict_do_nothing(index_elements=["split_id", "offset"])
                    )
        except FencedError:
            staged.unlink(missing_ok=True)
            return CommitResult(assignment.split_id, 0, 0, True, "")

        # Step 3: publish — move the staged file into place (idempotent; recovery redoes it).
        _publish(self._engine, txn_id, staged, target)
        return CommitResult(assignment.split_id, len(out.rows), len(out.dead), False, str(target))


def _publish(engine: Engine, txn_id: int, staged: Path, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    if staged.exists():
        os.replace(staged, target)
    elif not target.exists():
        raise FileNotFoundError(f"committed output of transaction {txn_id} is lost: {staged}")
    with engine.begin() as conn:
        conn.execute(
            sa.update(sink_transactions)
            .where(sink_transactions.c.id == txn_id)
            .values(published=True, published_at=sa.func.now())
        )


def publish_pending(engine: Engine) -> int:
    """Recovery: publish every transaction committed in Postgres but not yet moved into place."""
    with engine.connect() as conn:
        rows = conn.execute(
            sa.select(
                sink_transactions.c.id,
                sink_transactions.c.staged_path,
                sink_transactions.c.final_path,
            ).where(sink_transactions.c.committed, sa.not_(sink_transactions.c.published))
        ).all()
    for txn_id, staged, target in rows:
        _publish(engine, txn_id, Path(staged), Path(target))
    return len(rows)
