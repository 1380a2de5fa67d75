"""The committed sink-side watermark of a reader subtask (``snapshot["watermark"]``).

A retried attempt of subtask k (a restarted stage) resumes the watermark k's sink had reached
at the last completed checkpoint of the run, so the task's event time never moves backwards
after recovery. Sound: the marker reached the sink before that checkpoint, so every record
still in flight then (re-read on restore) and every record after the committed offsets came
after it in k's stream.

Threading: blocks on the database; call it before the task's mailbox loop runs.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from enumerator_service._schema import CheckpointStatus, checkpoint_acks, checkpoints

__all__ = ["committed_acks", "committed_task_watermark"]


def committed_acks(run_id: str, subtask: int, *columns: sa.ColumnElement[Any]) -> sa.Select[Any]:
    """``columns`` of ``subtask``'s acknowledgements that belong to completed checkpoints of
    ``run_id``: what the subtask committed (its snapshots at those checkpoints)."""
    completed = sa.and_(
        checkpoints.c.run_id == checkpoint_acks.c.run_id,
        checkpoints.c.checkpoint_id == checkpoint_acks.c.checkpoint_id,
    )
    return (
        sa.select(*columns)
        .select_from(checkpoint_acks.join(checkpoints, completed))
        .where(
            checkpoint_acks.c.run_id == run_id,
            checkpoint_acks.c.subtask == subtask,
            checkpoints.c.status == CheckpointStatus.COMPLETED,
        )
    )


def committed_task_watermark(engine: Engine, run_id: str, subtask: int) -> datetime | None:
    """``subtask``'s sink-side watermark at the run's last completed checkpoint that carries
    one (None: no completed checkpoint of this run has one yet)."""
    mark = checkpoint_acks.c.snapshot["watermark"].astext
    stmt = (
        committed_acks(run_id, subtask, mark)
        .where(mark.is_not(None))
        .order_by(checkpoint_acks.c.checkpoint_id.desc())
        .limit(1)
    )
    with engine.connect() as conn:
        found = conn.execute(stmt).scalar_one_or_none()
    return None if found is None else datetime.fromisoformat(found)
