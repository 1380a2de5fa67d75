"""The split store's side of a checkpoint: fenced completion, snapshot and restore of hand-outs.

``complete`` marks a split COMPLETED inside the checkpoint's Postgres transaction and fails
with ``FencedError`` when the attempt presents a stale epoch. The rest is the enumerator state
relative to checkpoints (Flink's ``SplitAssignmentTracker``, kept in Postgres): which
hand-outs a checkpoint captured, and which go back to the run's pool when a subtask restores
an earlier checkpoint.

Threading: every method blocks on the database; call them from a fetcher or committer thread,
never from a mailbox thread.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from enumerator_service._schema import SplitStatus, splits
from enumerator_service._splits import SplitAssignment

__all__ = ["FencedError", "SplitCompletion"]


class FencedError(Exception):
    """A commit presented a stale fencing epoch (the split was re-assigned meanwhile)."""


class SplitCompletion:
    """The checkpoint part of ``SplitStore`` (thread-safe: one Engine, no other state)."""

    _engine: Engine

    @staticmethod
    def complete(
        conn: Connection,
        assignment: SplitAssignment,
        run_id: str,
        committed_offset: int,
        watermark: datetime | None,
    ) -> None:
        """Mark the split COMPLETED inside the caller's transaction; FencedError if stale."""
        stmt = (
            sa.update(splits)
            .where(
                splits.c.id == assignment.split_id,
                splits.c.epoch == assignment.epoch,
                splits.c.run_id == run_id,
                splits.c.status == SplitStatus.READING,
            )
            .values(
                status=SplitStatus.COMPLETED,
                committed_offset=committed_offset,
                committed_watermark=watermark,
                lease_expires_at=None,
                completed_at=sa.func.now(),
            )
        )
        if conn.execute(stmt).rowcount != 1:
            raise FencedError(
                f"split {assignment.split_id} epoch {assignment.epoch} is no longer held by run "
                f"{run_id}; its output is discarded"
            )

    def snapshot_assignments(self, run_id: str, checkpoint_id: int) -> int:
        """Checkpoint ``checkpoint_id`` captures the run's hand-outs no snapshot has yet."""
        with self._engine.begin() as conn:
            return self.mark_snapshotted(conn, run_id, checkpoint_id)

    @staticmethod
    def mark_snapshotted(conn: Connection, run_id: str, checkpoint_id: int) -> int:
        """``snapshot_assignments`` inside the caller's transaction (checkpoint completion)."""
        stmt = (
            sa.update(splits)
            .where(
                splits.c.run_id == run_id,
                splits.c.status == SplitStatus.READING,
                splits.c.assigned_checkpoint.is_(None),
            )
            .values(assigned_checkpoint=checkpoint_id)
        )
        return conn.execute(stmt).rowcount

    def restore_assignments(
        self, run_id: str, subtask: int | None, checkpoint_id: int | None
    ) -> list[int]:
        """``subtask`` (every subtask: None) restores ``checkpoint_id`` (None: before any).

        The splits handed to it after that checkpoint go back to the run's pool
        (addSplitsBack), where any subtask can pull them; the ones handed out up to the
        checkpoint stay with it — they are part of its restored reader state. Completing a
        checkpoint needs no bookkeeping here: only the latest completed one is ever restored,
        so the hand-outs it covers are never returned again.
        """
        conditions = [splits.c.run_id == run_id, splits.c.status == SplitStatus.READING]
        if subtask is not None:
            conditions.append(splits.c.subtask == subtask)
        if checkpoint_id is not None:
            conditions.append(
                sa.or_(
                    splits.c.assigned_checkpoint.is_(None),
                    splits.c.assigned_checkpoint > checkpoint_id,
                )
            )
        stmt = (
            sa.update(splits)
            .where(*conditions)
            .values(status=SplitStatus.ASSIGNED, subtask=None, assigned_checkpoint=None)
            .returning(splits.c.id)
        )
        with self._engine.begin() as conn:
            return sorted(conn.execute(stmt).scalars())

    def return_splits(self, run_id: str, split_ids: Sequence[int]) -> int:
        """Give specific hand-outs of the run back to its pool (Flink's addSplitsBack)."""
        stmt = (
            sa.update(splits)
            .where(
                splits.c.run_id == run_id,
                splits.c.status == SplitStatus.READING,
                splits.c.id.in_(list(split_ids)),
            )
            .values(status=SplitStatus.ASSIGNED, subtask=None, assigned_checkpoint=None)
        )
        with self._engine.begin() as conn:
            return conn.execute(stmt).rowcount
