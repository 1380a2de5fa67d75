"""Level 1 of split assignment: splits assigned to a *run*, under a lease the run renews.

The enumerator side of ``SplitStore``: a run assigns itself the source's unassigned splits,
its driver renews their lease (``heartbeat_run``), and splits whose run stopped renewing, or
that a run gives back, return to the pool (Flink's ``addSplitsBack``).

Threading: every method blocks on the database; call them from a fetcher or committer thread,
never from a mailbox thread.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import date, datetime

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from enumerator_service._schema import ACTIVE_SPLIT, SplitStatus, splits
from enumerator_service._splits import STREAM_KINDS

__all__ = ["RunAssignment", "lease"]

#: A split given back to the pool: no run, no subtask, no lease, no checkpointed hand-out.
_RETURNED: dict[str, object] = {
    "status": SplitStatus.UNASSIGNED,
    "run_id": None,
    "subtask": None,
    "lease_expires_at": None,
    "assigned_checkpoint": None,
    "released_at": sa.func.now(),
}


def lease(seconds: float) -> sa.ColumnElement[datetime]:
    """The expiry of a lease of ``seconds`` taken now (the database's clock)."""
    return sa.func.now() + sa.func.make_interval(0, 0, 0, 0, 0, 0, sa.literal(seconds))


class RunAssignment:
    """The run-level part of ``SplitStore`` (thread-safe: one Engine, no other state)."""

    _engine: Engine

    def release_expired(self, source: str) -> int:
        """Return splits whose run or subtask stopped renewing its lease to the pool."""
        stmt = (
            sa.update(splits)
            .where(
                splits.c.source == source,
                splits.c.status.in_(ACTIVE_SPLIT),
                splits.c.lease_expires_at < sa.func.now(),
            )
            .values(**_RETURNED)
        )
        with self._engine.begin() as conn:
            return conn.execute(stmt).rowcount

    def assign_to_run(
        self,
        run_id: str,
        source: str,
        *,
        lease_seconds: float,
        partition_keys: Sequence[date] | None = None,
    ) -> int:
        """Assign every unassigned split of ``source`` (optionally of some dates) to a run.

        A stream's split of a day (a Kafka day split: a time range re-read for a backfill)
        goes only to a run of its day: a run of all new input (``partition_keys`` None: a
        continuous run, a schedule) reads the stream's main line, which holds those
        records too."""
        conditions = [splits.c.source == source, splits.c.status == SplitStatus.UNASSIGNED]
        if partition_keys is not None:
            conditions.append(splits.c.partition_key.in_(list(partition_keys)))
        else:
            conditions.append(
                sa.or_(splits.c.kind.not_in(sorted(STREAM_KINDS)), splits.c.partition_key.is_(None))
            )
        stmt = (
            sa.update(splits)
            .where(*conditions)
            .values(
                status=SplitStatus.ASSIGNED,
                run_id=run_id,
                subtask=None,
                assigned_at=sa.func.now(),
                lease_expires_at=lease(lease_seconds),
            )
        )
        with self._engine.begin() as conn:
            return conn.execute(stmt).rowcount

    def heartbeat_run(self, run_id: str, lease_seconds: float) -> int:
        """Extend the lease of every split the run holds; returns how many it holds."""
        stmt = (
            sa.update(splits)
            .where(splits.c.run_id == run_id, splits.c.status.in_(ACTIVE_SPLIT))
            .values(lease_expires_at=lease(lease_seconds))
        )
        with self._engine.begin() as conn:
            return conn.execute(stmt).rowcount

    def expired_leases(self, run_id: str) -> int:
        """How many splits the run holds (ASSIGNED or READING) whose lease ran out.

        A live run's driver renews the lease of every split its run holds each third of a
        lease (``heartbeat_run``), so any such split means that heartbeat stopped.
        """
        stmt = sa.select(sa.func.count()).where(
            splits.c.run_id == run_id,
            splits.c.status.in_(ACTIVE_SPLIT),
            splits.c.lease_expires_at < sa.func.now(),
        )
        with self._engine.connect() as conn:
            return int(conn.execute(stmt).scalar_one())

    def unread_of_run(self, run_id: str) -> int:
        """How many splits the run holds whose last attempt did not fail on its content —
        after its readers ended, input a bounded run skipped (``InputLeft.returned``)."""
        stmt = sa.select(sa.func.count()).where(
            splits.c.run_id == run_id,
            splits.c.status.in_(ACTIVE_SPLIT),
            splits.c.failed_epoch.is_distinct_from(splits.c.epoch),
        )
        with self._engine.connect() as conn:
            return int(conn.execute(stmt).scalar_one())

    def release_run(self, run_id: str) -> int:
        """Return the run's splits that no commit covers to the pool (addSplitsBack)."""
        stmt = (
            sa.update(splits)
            .where(splits.c.run_id == run_id, splits.c.status.in_(ACTIVE_SPLIT))
            .values(**_RETURNED)
        )
        with self._engine.begin() as conn:
            return conn.execute(stmt).rowcount
