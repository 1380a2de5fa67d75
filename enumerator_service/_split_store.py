"""The Postgres-backed split store: registration, two-level assignment, leases, fencing.

Level 1 (enumerator side): splits are registered idempotently and assigned to a *run*.
Level 2 (reader side): subtasks of that run *pull* their next split lazily with
``SELECT … FOR UPDATE SKIP LOCKED``; every hand-out bumps the split's fencing epoch, and every
commit must present that epoch, so a zombie attempt can never commit.

Threading: every method blocks on the database; call them from a fetcher or committer thread,
never from a mailbox thread.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import date, datetime

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.engine import Connection, Engine, Row

from enumerator_service._file_identity import recorded_identity
from enumerator_service._rebuild_lock import holds, lock_rebuilds
from enumerator_service._schema import ACTIVE_SPLIT, SplitStatus, splits
from enumerator_service._split_pull import pull_parameters, pull_statement
from enumerator_service._splits import (
    STREAM_KINDS,
    TABLE_KINDS,
    FileSplit,
    Split,
    SplitAssignment,
    StreamSplit,
    TableRangeSplit,
)

__all__ = ["FencedError", "SplitStore"]

#: A split given back to the pool: no run, no subtask, no lease, no checkpointed hand-out.
_RETURNED: dict[str, object] = {
    "status": SplitStatus.UNASSIGNED,
    "run_id": None,
    "subtask": None,
    "lease_expires_at": None,
    "assigned_checkpoint": None,
}


class FencedError(Exception):
    """A commit presented a stale fencing epoch (the split was re-assigned meanwhile)."""


def _lease(seconds: float) -> sa.ColumnElement[datetime]:
    return sa.func.now() + sa.func.make_interval(0, 0, 0, 0, 0, 0, sa.literal(seconds))


def _to_assignment(row: Row[tuple[object, ...]]) -> SplitAssignment:
    m = row._mapping
    split: Split
    if m["kind"] in TABLE_KINDS:
        split = TableRangeSplit.from_uri(
            m["source"], m["uri"], m["start_offset"], m["end_offset"], m["kind"]
        )
    elif m["kind"] in STREAM_KINDS:
        split = StreamSplit(
            m["source"], m["kind"], m["uri"], m["start_offset"], m["end_offset"], m["partition_key"]
        )
    else:
        split = FileSplit(
            source=m["source"],
            kind=m["kind"],
            path=m["uri"],
            start=m["start_offset"],
            end=m["end_offset"],
            partition_key=m["partition_key"],
            file=recorded_identity(m),
            version=m["file_version"],
        )
    offset = m["committed_offset"] if m["committed_offset"] is not None else m["start_offset"]
    return SplitAssignment(
        split_id=m["id"],
        split=split,
        epoch=m["epoch"],
        resume_offset=offset,
        pending=tuple(m["pending"] or ()),
        rebuild_id=m["rebuild_id"],
        rebuild_day=m["rebuild_day"],
        rebuild_fresh=m["rebuild_fresh"],
        committed_watermark=m["committed_watermark"],
    )


_COLUMNS = (
    "source",
    "kind",
    "uri",
    "start_offset",
    "end_offset",
    "partition_key",
    "file_size",
    "file_mtime_ns",
    "file_inode",
    "file_version",
)


def _row_of(split: Split) -> dict[str, object]:
    file = split.file if isinstance(split, FileSplit) else None
    return {
        "source": split.source,
        "kind": split.kind,
        "uri": split.path,
        "start_offset": split.start,
        "end_offset": split.end,
        "partition_key": split.partition_key,
        "file_size": file.size if file is not None else None,
        "file_mtime_ns": file.mtime_ns if file is not None else None,
        "file_inode": file.inode if file is not None else None,
        "file_version": split.version if isinstance(split, FileSplit) else 0,
    }


def _insert(conn: Connection, rows: list[dict[str, object]]) -> list[int]:
    # One array parameter per column, expanded server-side by unnest(): a fixed statement
    # (compiled once, cached) with one parameter per column, whatever the batch size. A
    # multi-row VALUES list compiles a bind parameter per row and column, which dominated
    # registration time.
    arrays = sa.func.unnest(
        *(sa.bindparam(f"{name}_array", type_=sa.ARRAY(splits.c[name].type)) for name in _COLUMNS)
    )
    values = arrays.table_valued(*_COLUMNS).render_derived(name="v")
    rebuilding = holds(values.c.source, values.c.partition_key)
    status = sa.case(
        (rebuilding, sa.literal(SplitStatus.HELD.value)),
        else_=sa.literal(SplitStatus.UNASSIGNED.value),
    )
    stmt = (
        insert(splits)
        .from_select(
            (*_COLUMNS, "status"),
            sa.select(*(values.c[name] for name in _COLUMNS), status),
        )
        .on_conflict_do_nothing(index_elements=["source", "uri", "start_offset", "file_version"])
        .returning(splits.c.id)
    )
    params = {f"{name}_array": [row[name] for row in rows] for name in _COLUMNS}
    return list(conn.execute(stmt, params).scalars())


class SplitStore:
    """Split registration and assignment over one SQLAlchemy Engine (thread-safe)."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine

    # -- registration -------------------------------------------------------------------

    def register(self, new_splits: Iterable[Split], *, batch_size: int = 5000) -> int:
        """Insert splits not yet known; returns how many were new. Idempotent.

        A split of a partition being rebuilt (any split of a source rebuilding an event day)
        is registered HELD: it joins the pool when the rebuild's swap releases it (see
        ``enumerator_service._rebuilds``).
        """
        added = 0
        batch: list[Split] = []
        with self._engine.begin() as conn:
            for split in new_splits:
                batch.append(split)
                if len(batch) >= batch_size:
                    added += len(self.insert(conn, batch))
                    batch = []
            if batch:
                added += len(self.insert(conn, batch))
        return added

    @staticmethod
    def insert(conn: Connection, new_splits: Sequence[Split]) -> list[int]:
        """``register`` inside the caller's transaction: the ids of the splits that were new."""
        # Shared with other registrations, exclusive with a rebuild's start and swap: a
        # split is either seen by the swap's release or registered after it.
        for source in sorted({split.source for split in new_splits}):
            lock_rebuilds(conn, source, shared=True)
        return _insert(conn, [_row_of(split) for split in new_splits]) if new_splits else []

    # -- level 1: assignment to a run ----------------------------------------------------

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
                lease_expires_at=_lease(lease_seconds),
            )
        )
        with self._engine.begin() as conn:
            return conn.execute(stmt).rowcount

    def heartbeat_run(self, run_id: str, lease_seconds: float) -> int:
        """Extend the lease of every split the run holds; returns how many it holds."""
        stmt = (
            sa.update(splits)
            .where(splits.c.run_id == run_id, splits.c.status.in_(ACTIVE_SPLIT))
            .values(lease_expires_at=_lease(lease_seconds))
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

    def release_run(self, run_id: str) -> int:
        """Return the run's splits that no commit covers to the pool (addSplitsBack)."""
        stmt = (
            sa.update(splits)
            .where(splits.c.run_id == run_id, splits.c.status.in_(ACTIVE_SPLIT))
            .values(**_RETURNED)
        )
        with self._engine.begin() as conn:
            return conn.execute(stmt).rowcount

    # -- level 2: pull-based hand-out to subtasks ----------------------------------------

    def reclaim(self, run_id: str, subtask: int, lease_seconds: float) -> list[SplitAssignment]:
        """Splits this subtask held in an earlier attempt, re-issued under a new epoch.

        A retried task restores its splits exactly as it would be assigned new ones; the epoch
        bump fences the earlier attempt if it is still alive somewhere.
        """
        stmt = (
            sa.update(splits)
            .where(
                splits.c.run_id == run_id,
                splits.c.subtask == subtask,
                splits.c.status == SplitStatus.READING,
            )
            .values(epoch=splits.c.epoch + 1, lease_expires_at=_lease(lease_seconds))
            .returning(*splits.c)
        )
        with self._engine.begin() as conn:
            rows = conn.execute(stmt).fetchall()
        return sorted((_to_assignment(r) for r in rows), key=lambda a: a.split_id)

    def pull_next(self, run_id: str, subtask: int, lease_seconds: float) -> SplitAssignment | None:
        """Hand the next split of the run to ``subtask``; None when the run has none left.

        May block (one database round trip).
        """
        pulled = self.pull_splits(run_id, subtask, lease_seconds, max_splits=1)
        return pulled[0] if pulled else None

    def pull_splits(
        self,
        run_id: str,
        subtask: int,
        lease_seconds: float,
        *,
        max_splits: int,
        max_bytes: int = 0,
        owned_kinds: Sequence[str] = (),
        owners: int = 1,
    ) -> list[SplitAssignment]:
        """Hand the next splits of the run to ``subtask`` in one transaction; [] when none left.

        Splits of ``owned_kinds`` (stream partitions) are handed only to the subtask that
        owns them among ``owners`` (a stable function of the partition's name, Flink's
        owner rule), so each partition has one reader for the whole run and partitions
        found later go to their owner.

        The first split in (partition_key, id) order that no concurrent puller holds is always
        handed out. Up to ``max_splits - 1`` further ones follow only while they are *small*:
        byte ranges of a line file (``jsonl``, ``csv``) whose sizes, the first split's
        included, add up to at most ``max_bytes``. A split of unknown size (a whole gzip or
        Parquet file, a table key range) is handed out only alone, so a batch can never keep
        much work from idle pullers. Every split in the batch gets its own new fencing epoch
        and lease, exactly as one ``pull_next`` each would; the list is in (partition_key, id)
        order. May block (one database round trip).
        """
        params = pull_parameters(
            run_id,
            subtask,
            lease_seconds,
            max_splits=max_splits,
            max_bytes=max_bytes,
            owned_kinds=owned_kinds,
            owners=owners,
        )
        # Its own implicit transaction (AUTOCOMMIT: no BEGIN/COMMIT round trips).
        stmt = pull_statement(self._engine.dialect.identifier_preparer)
        with self._engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            rows = conn.execute(stmt, params).fetchall()
        # RETURNING has no order; NULL partition keys sort last, as in the statement.
        ordered = sorted(
            rows, key=lambda r: (r.partition_key is None, r.partition_key or date.min, r.id)
        )
        return [_to_assignment(row) for row in ordered]

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

    # -- enumerator state relative to checkpoints (SplitAssignmentTracker in Postgres) ---

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

    # -- inspection ----------------------------------------------------------------------

    def counts(self, source: str | None = None) -> dict[str, int]:
        """Number of splits per status."""
        stmt = sa.select(splits.c.status, sa.func.count()).group_by(splits.c.status)
        if source is not None:
            stmt = stmt.where(splits.c.source == source)
        with self._engine.connect() as conn:
            return {str(status): int(n) for status, n in conn.execute(stmt).all()}
