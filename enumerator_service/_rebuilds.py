"""Partition rebuilds: re-materialising a processed partition replaces its output exactly.

A rebuild of partition D re-reads every split of D into a folder of its own, then swaps that
folder with D's live folder in one step. Readers see the old generation or the new one, never
a mix, and a run that dies half-way leaves the old generation in place.

Lifecycle of one rebuild (this module is its Postgres side; the folder swap is the sink's):

1. ``start`` (one transaction, the source's rebuild lock held exclusively): every split of D
   is reset — progress, pending inputs and dead-letter ownership start over — under a new
   fencing epoch (a zombie of the previous generation can no longer commit) and assigned to
   the starting run as a *member* of the rebuild (``splits.rebuild_id``). Files registered
   while the rebuild runs are HELD: they are not part of the old generation, so they join D
   only after the swap.
2. Members are processed like any split (by the starting run, or by any later run if it
   dies); their output is published into the rebuild's folder.
3. When every member is COMPLETED the rebuild is *ready*: ``begin_swap`` marks it SWAPPING,
   the sink swaps the folders (idempotently: a marker file names the rebuild now live), and
   ``end_swap`` marks it DONE, drops the previous generation's dead letters and releases
   the HELD splits. A crash anywhere in between is finished by the next ``ready`` caller.

Rebuilds by event day (not implemented yet; today :class:`CrossDayRebuildError`). With
event-day partitions a landing file may feed several days, so "the splits of D" (landing day
D) is neither all of D's input nor only D's. A day holding rows of other days' files
(``partition_stats.foreign_rows`` > 0) is refused in ``start`` before anything changes: the
CLI prints one line (exit 2), Dagster fails the run with a ``Failure`` (not retried). The
design that lifts the refusal:

1. Record what each split produced: a ``split_partitions(split_id, partition_key, rows,
   dead_letters)`` table (added to migration 0008, unreleased), filled in the checkpoint's
   completion transaction next to ``partition_stats`` from per-split counts the
   acknowledgement carries (``EventDays`` keys its counts by (split, day) instead of day;
   ``take_counts`` sums them for ``partition_stats``). A split re-read after a restore only
   adds the counts of checkpoints that commit, so the table is exact like the stats.
2. ``start(D)``: the members are every split with a ``split_partitions`` row for D plus the
   splits landing on D (a file whose rows were all filtered or dead-lettered has none).
   ``splits.rebuild_id`` stays one rebuild per split: rebuilding D and D' at once, where one
   split fed both, makes one rebuild that covers both days (``partition_rebuilds`` gains the
   set of days; one folder per day, swapped together), or simply refuses the overlap.
3. A member writes only the rows whose event day is the rebuild's day (``EventDays.write``'s
   ``only`` becomes the rebuild's day, not the split's landing day) into the rebuild folder;
   its other days' rows are counted as dropped (they stay in their partitions). Resetting a
   member's offsets must not reset what it committed for other days: its dead letters of
   other event days stay (``end_swap`` deletes only dead letters whose event day is D, which
   needs ``dead_letters.partition_key``), and its other days' ``split_partitions`` rows stay.
4. Members count their output per day as usual, into a rebuild-scoped tally (the rebuild's
   ``split_partitions`` rows, with ``rebuild_id``), not into ``partition_stats``.
5. ``end_swap`` (one transaction, the source's completeness lock taken too): D's
   ``partition_stats`` are reset to the rebuild's tally (rows, dead letters; late records 0,
   foreign rows recomputed), the members' old ``split_partitions`` rows for D are replaced by
   the rebuild's, and a new ``partition_completions`` generation of D is recorded (when D was
   complete before and no split that may still carry D's records is unfinished, as in
   ``complete_partitions``), so the reporter re-reports the day; otherwise D is left open and
   completes with the next checkpoint past it.

Threading: every method blocks on the database; never call them from a mailbox thread.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import date, datetime

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine, Row

from enumerator_service._rebuild_lock import ACTIVE_REBUILD, lock_rebuilds
from enumerator_service._schema import (
    ACTIVE_SPLIT,
    RebuildStatus,
    SplitStatus,
    dead_letters,
    partition_rebuilds,
    partition_stats,
    splits,
)

__all__ = ["CrossDayRebuildError", "PartitionBusyError", "Rebuild", "RebuildStore"]


class PartitionBusyError(RuntimeError):
    """A partition to rebuild is being read by another live run."""


class CrossDayRebuildError(RuntimeError):
    """A partition to rebuild holds rows from files of other landing days (event-day
    partitions): a rebuild re-reads only the day's own files and would drop them. Raised
    before anything changed (see "Rebuilds by event day" in the module docstring)."""

    def __init__(self, source: str, partition_key: date, foreign_rows: int) -> None:
        super().__init__(
            f"partition {partition_key} of {source!r} holds {foreign_rows} rows from files of "
            "other days, which a rebuild does not re-read: re-materialising it is not "
            "supported yet"
        )
        self.source, self.partition_key, self.foreign_rows = source, partition_key, foreign_rows


@dataclass(frozen=True, slots=True)
class Rebuild:
    id: int
    source: str
    partition_key: date
    run_id: str
    status: str


def _rebuild(row: Row[tuple[object, ...]]) -> Rebuild:
    m = row._mapping
    return Rebuild(m["id"], m["source"], m["partition_key"], m["run_id"], m["status"])


def _lease(seconds: float) -> sa.ColumnElement[datetime]:
    return sa.func.now() + sa.func.make_interval(0, 0, 0, 0, 0, 0, sa.literal(seconds))


class RebuildStore:
    """Rebuild bookkeeping over one SQLAlchemy Engine (thread-safe)."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine

    def start(
        self, source: str, days: Sequence[date], run_id: str, *, lease_seconds: float
    ) -> list[Rebuild]:
        """Start rebuilding each of ``days`` that holds processed splits; returns the rebuilds.

        Days whose splits were never read are left alone (their first run is no rebuild). A
        rebuild of the same day that a dead run left unfinished is abandoned (its folder is
        swept later); one whose splits a live run holds raises :class:`PartitionBusyError`,
        as does any split of the days that another live run is reading.
        """
        if not days:
            return []
        of_days = sa.and_(splits.c.source == source, splits.c.partition_key.in_(list(days)))
        with self._engine.begin() as conn:
            lock_rebuilds(conn, source)
            # Step 1: the days that hold output (or a rebuild) of an earlier run.
            processed = sorted(
                conn.execute(
                    sa.select(splits.c.partition_key)
                    .where(
                        of_days,
                        sa.or_(
                            splits.c.status.not_in((SplitStatus.UNASSIGNED, SplitStatus.HELD)),
                            splits.c.committed_offset.is_not(None),
                            splits.c.rebuild_id.is_not(None),
                        ),
                    )
                    .distinct()
                ).scalars()
            )
            if not processed:
                return []
            # Step 1b: with event-day partitions a day may hold rows of other days' files,
            # which a rebuild (by landing day) does not re-read: refused rather than dropped.
            foreign = conn.execute(
                sa.select(partition_stats.c.partition_key, partition_stats.c.foreign_rows)
                .where(
                    partition_stats.c.source == source,
                    partition_stats.c.partition_key.in_(processed),
                    partition_stats.c.foreign_rows > 0,
                )
                .order_by(partition_stats.c.partition_key)
                .limit(1)
            ).first()
            if foreign is not None:
                raise CrossDayRebuildError(source, foreign.partition_key, foreign.foreign_rows)
            in_days = sa.and_(splits.c.source == source, splits.c.partition_key.in_(processed))
            # Step 2: nobody else may be reading them (an expired lease holds nothing).
            busy = conn.execute(
                sa.select(splits.c.partition_key, splits.c.run_id)
                .where(
                    in_days,
                    splits.c.status.in_(ACTIVE_SPLIT),
                    splits.c.run_id != run_id,
                    splits.c.lease_expires_at > sa.func.now(),
                )
                .limit(1)
            ).first()
            if busy is not None:
                raise PartitionBusyError(
                    f"partition {busy.partition_key} of {source!r} is being read by run "
                    f"{busy.run_id}; re-materialise it once that run has ended"
                )
            # Step 3: an unfinished rebuild of these days is abandoned (its run is dead).
            swapping = conn.execute(
                sa.select(partition_rebuilds.c.partition_key).where(
                    partition_rebuilds.c.source == source,
                    partition_rebuilds.c.partition_key.in_(processed),
                    partition_rebuilds.c.status == RebuildStatus.SWAPPING,
                )
            ).first()
            if swapping is not None:
                raise PartitionBusyError(
                    f"partition {swapping.partition_key} of {source!r} is being swapped; "
                    "finish_rebuilds() first"
                )
            conn.execute(
                sa.update(partition_rebuilds)
                .where(
                    partition_rebuilds.c.source == source,
                    partition_rebuilds.c.partition_key.in_(processed),
                    partition_rebuilds.c.status == RebuildStatus.BUILDING,
                )
                .values(status=RebuildStatus.ABANDONED)
            )
            # Step 4: one new rebuild per day.
            started = [
                _rebuild(row)
                for row in conn.execute(
                    sa.insert(partition_rebuilds)
                    .values(
                        [
                            {"source": source, "partition_key": day, "run_id": run_id}
                            for day in processed
                        ]
                    )
                    .returning(*partition_rebuilds.c)
                ).all()
            ]
            # Step 5: every split of those days starts over as a member, assigned to us.
            ids = {rebuild.partition_key: rebuild.id for rebuild in started}
            conn.execute(
                sa.update(splits)
                .where(in_days)
                .values(
                    status=SplitStatus.ASSIGNED,
                    run_id=run_id,
                    subtask=None,
                    lease_expires_at=_lease(lease_seconds),
                    assigned_at=sa.func.now(),
                    assigned_checkpoint=None,
                    committed_offset=None,
                    committed_watermark=None,
                    pending=None,
                    completed_at=None,
                    epoch=splits.c.epoch + 1,
                    rebuild_id=sa.case(ids, value=splits.c.partition_key),
                )
            )
        return sorted(started, key=lambda r: r.partition_key)

    def pending(self, source: str | None = None) -> list[Rebuild]:
        """Rebuilds not finished yet (BUILDING or SWAPPING)."""
        stmt = sa.select(partition_rebuilds).where(partition_rebuilds.c.status.in_(ACTIVE_REBUILD))
        if source is not None:
            stmt = stmt.where(partition_rebuilds.c.source == source)
        with self._engine.connect() as conn:
            return [_rebuild(row) for row in conn.execute(stmt.order_by("id")).all()]

    def ready(self, source: str | None = None) -> list[Rebuild]:
        """Rebuilds to swap now: SWAPPING ones (a crash interrupted them) and BUILDING ones
        whose members have all completed."""
        unfinished = sa.exists().where(
            splits.c.rebuild_id == partition_rebuilds.c.id, splits.c.status != SplitStatus.COMPLETED
        )
        stmt = sa.select(partition_rebuilds).where(
            sa.or_(
                partition_rebuilds.c.status == RebuildStatus.SWAPPING,
                sa.and_(partition_rebuilds.c.status == RebuildStatus.BUILDING, sa.not_(unfinished)),
            )
        )
        if source is not None:
            stmt = stmt.where(partition_rebuilds.c.source == source)
        with self._engine.connect() as conn:
            return [_rebuild(row) for row in conn.execute(stmt.order_by("id")).all()]

    def finished_ids(self, ids: Sequence[int]) -> set[int]:
        """Which of ``ids`` are DONE or ABANDONED (their folders hold nothing live)."""
        if not ids:
            return set()
        stmt = sa.select(partition_rebuilds.c.id).where(
            partition_rebuilds.c.id.in_(list(ids)),
            partition_rebuilds.c.status.in_((RebuildStatus.DONE, RebuildStatus.ABANDONED)),
        )
        with self._engine.connect() as conn:
            return set(conn.execute(stmt).scalars())

    def unfinished_members(self, rebuild_ids: Sequence[int]) -> int:
        """How many member splits of the rebuilds ``rebuild_ids`` are not COMPLETED yet."""
        with self._engine.connect() as conn:
            return self._unfinished(conn, rebuild_ids)

    @staticmethod
    def _unfinished(conn: Connection, rebuild_ids: Sequence[int]) -> int:
        if not rebuild_ids:
            return 0
        return int(
            conn.execute(
                sa.select(sa.func.count()).where(
                    splits.c.rebuild_id.in_(list(rebuild_ids)),
                    splits.c.status != SplitStatus.COMPLETED,
                )
            ).scalar_one()
        )

    def begin_swap(self, rebuild: Rebuild) -> bool:
        """BUILDING → SWAPPING if every member completed (True); True if already SWAPPING."""
        with self._engine.begin() as conn:
            lock_rebuilds(conn, rebuild.source)
            status = self._status(conn, rebuild.id)
            if status == RebuildStatus.SWAPPING:
                return True
            if status != RebuildStatus.BUILDING:
                return False
            if self._unfinished(conn, [rebuild.id]):
                return False
            conn.execute(
                sa.update(partition_rebuilds)
                .where(partition_rebuilds.c.id == rebuild.id)
                .values(status=RebuildStatus.SWAPPING)
            )
            return True

    def end_swap(self, rebuild: Rebuild) -> None:
        """After the folders were swapped: DONE, the previous generation's dead letters go,
        the members leave the rebuild and the HELD splits of the partition join the pool."""
        with self._engine.begin() as conn:
            lock_rebuilds(conn, rebuild.source)
            if self._status(conn, rebuild.id) != RebuildStatus.SWAPPING:
                return  # finished by someone else meanwhile
            of_partition = sa.select(splits.c.id).where(
                splits.c.source == rebuild.source,
                splits.c.partition_key == rebuild.partition_key,
            )
            conn.execute(
                sa.delete(dead_letters).where(
                    dead_letters.c.split_id.in_(of_partition),
                    dead_letters.c.rebuild_id.is_distinct_from(rebuild.id),
                )
            )
            conn.execute(
                sa.update(splits).where(splits.c.rebuild_id == rebuild.id).values(rebuild_id=None)
            )
            conn.execute(
                sa.update(splits)
                .where(
                    splits.c.source == rebuild.source,
                    splits.c.partition_key == rebuild.partition_key,
                    splits.c.status == SplitStatus.HELD,
                )
                .values(status=SplitStatus.UNASSIGNED)
            )
            conn.execute(
                sa.update(partition_rebuilds)
                .where(partition_rebuilds.c.id == rebuild.id)
                .values(status=RebuildStatus.DONE, swapped_at=sa.func.now())
            )

    @staticmethod
    def _status(conn: Connection, rebuild_id: int) -> str | None:
        return conn.execute(
            sa.select(partition_rebuilds.c.status)
            .where(partition_rebuilds.c.id == rebuild_id)
            .with_for_update()
        ).scalar_one_or_none()
