"""Partition rebuilds: re-materialising a processed partition replaces its output exactly.

A rebuild of partition D re-reads every split that fed D into a folder of its own, then
swaps that folder with D's live folder in one step. Readers see the old generation or the
new one, never a mix, and a run that dies half-way leaves the old generation in place.

Rebuilds by event day. With event-day partitions a landing file may feed several days, so
the members of a rebuild of D (``_rebuild_members``) are the splits landing on D plus every
split that fed D: ``split_partitions`` records, with the checkpoint that committed them,
which days each split wrote rows or dead letters to. Each member is re-read from scratch
and writes only its records of D (``splits.rebuild_day``): its rows of other days stay in
their partitions (counted as dropped), its dead letters of other days stay as first written
(not written again, so never twice; a reader's dead letter counts on its landing day). A
member is *reset* (its offsets start over under a new epoch), not copied: at the swap it is
COMPLETED again with its other days' output untouched. So every member must have been read to
the end before (else its unread rows of other days would never be written) — except a
*fresh* one (``splits.rebuild_fresh``: a file of D that no run had read), which writes its
other days' records as any first reading does. And no other split of the source may write
rows of D before the swap (they would be lost with the folder replaced): files no run has
read yet are HELD when the rebuild starts, as are files registered meanwhile (read by the
next run, after the swap); a half-read one is refused. Refusals raise
:class:`CrossDayRebuildError` (one line) before anything changed; so do two days rebuilt in
one run that share a file (a split belongs to one rebuild, which writes one day).

Without event-day partitions every row of D comes from D's files: the members are those
files, nothing else is held or checked.

Lifecycle of one rebuild (this module is its Postgres side; the folder swap is the sink's):

1. ``start`` (one transaction, the source's rebuild lock held exclusively): every member of
   D starts over — progress and pending inputs — under a new fencing epoch (a zombie of the
   previous generation can no longer commit), assigned to the starting run as a *member*
   of the rebuild (``splits.rebuild_id``, ``rebuild_day``, ``rebuild_fresh``). Files
   registered while the rebuild runs are HELD (for an event-day source: every file of the
   source, and the unread ones already registered).
2. Members are processed like any split (by the starting run, or by any later run if it
   dies); their output of D is published into the rebuild's folder, and their counts of D
   (rows, dead letters, foreign rows) add up in ``partition_rebuilds`` with the checkpoint
   that commits them, not in ``partition_stats``.
3. When every member is COMPLETED the rebuild is *ready*: ``begin_swap`` marks it SWAPPING,
   the sink swaps the folders (idempotently: a marker file names the rebuild now live), and
   ``end_swap`` (one transaction) marks it DONE, drops D's dead letters of earlier
   generations, sets D's ``partition_stats`` to the rebuild's counts, records a new
   ``partition_completions`` generation of D if D was complete (so the Dagster reporter
   re-reports it; otherwise D completes with the next checkpoint past it, as usual) and
   releases the HELD splits. A crash anywhere in between is finished by the next ``ready``
   caller; until the swap the old generation stays live and counted.

Threading: every method blocks on the database; never call them from a mailbox thread.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import date, datetime

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine, Row

from enumerator_service._rebuild_lock import ACTIVE_REBUILD, holds, lock_rebuilds
from enumerator_service._rebuild_members import (
    CrossDayRebuildError,
    PartitionBusyError,
    hold_unread,
    members,
    processed_days,
)
from enumerator_service._rebuild_stats import replace_partition
from enumerator_service._schema import (
    RebuildStatus,
    SplitStatus,
    dead_letters,
    partition_rebuilds,
    splits,
)

__all__ = ["CrossDayRebuildError", "PartitionBusyError", "Rebuild", "RebuildStore"]


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
        self,
        source: str,
        days: Sequence[date],
        run_id: str,
        *,
        lease_seconds: float,
        event_days: bool = False,
        fed_members: bool = True,
    ) -> list[Rebuild]:
        """Start rebuilding each of ``days`` that was processed; returns the rebuilds.

        Days never processed are left alone (their first run is no rebuild). A rebuild of
        the same day that a dead run left unfinished is abandoned (its folder is swept
        later); a member a live run holds raises :class:`PartitionBusyError`.
        ``event_days``: the source partitions by event day (module docstring: the checks of
        :class:`CrossDayRebuildError`, files HELD source-wide). ``fed_members`` False: the
        members are the day's own splits only (a source whose splits of a day hold exactly
        its records: Kafka's time-bounded day splits), not every split that fed it; they
        must overlap, per stream, the offsets the day's committed rows came from, else
        :class:`CrossDayRebuildError` (an empty day range never replaces committed rows).
        """
        if not days:
            return []
        with self._engine.begin() as conn:
            lock_rebuilds(conn, source)
            # Step 1: the days that hold output (or a rebuild) of an earlier run.
            processed = processed_days(conn, source, days)
            if not processed:
                return []
            # Step 2: event days: the files no run read yet wait for the swap (first, so
            # that no run can take one between the checks and the commit: row locks).
            if event_days:
                hold_unread(conn, source, processed)
            # Step 2b: the members, checked (a raise rolls everything back).
            member_ids, fresh = members(
                conn, source, processed, run_id, event_days=event_days, fed=fed_members
            )
            # Step 3: a swap in progress must finish first.
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
            # Step 4: an unfinished rebuild of these days is abandoned (its run is dead).
            conn.execute(
                sa.update(partition_rebuilds)
                .where(
                    partition_rebuilds.c.source == source,
                    partition_rebuilds.c.partition_key.in_(processed),
                    partition_rebuilds.c.status == RebuildStatus.BUILDING,
                )
                .values(status=RebuildStatus.ABANDONED)
            )
            # Step 5: one new rebuild per day.
            started = [
                _rebuild(row)
                for row in conn.execute(
                    sa.insert(partition_rebuilds)
                    .values(
                        [
                            {
                                "source": source,
                                "partition_key": day,
                                "run_id": run_id,
                                "event_days": event_days,
                            }
                            for day in processed
                        ]
                    )
                    .returning(*partition_rebuilds.c)
                ).all()
            ]
            # Step 6: every member starts over, assigned to us.
            for rebuild in started:
                conn.execute(
                    sa.update(splits)
                    .where(splits.c.id.in_(member_ids[rebuild.partition_key]))
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
                        rebuild_id=rebuild.id,
                        rebuild_day=rebuild.partition_key,
                        rebuild_fresh=splits.c.id.in_(list(fresh)),
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
        """After the folders were swapped, in one transaction: DONE, the partition's dead
        letters of earlier generations go, its stats become the rebuild's counts, a new
        completion generation if it was complete, the members leave the rebuild and the
        HELD splits the rebuild held join the pool."""
        with self._engine.begin() as conn:
            lock_rebuilds(conn, rebuild.source)
            if self._status(conn, rebuild.id) != RebuildStatus.SWAPPING:
                return  # finished by someone else meanwhile
            # Step 1: D's dead letters of earlier generations — every dead letter of the
            # source counted on D that the rebuild did not write (the members', those of
            # older versions of changed files, a Kafka main line's: the day splits re-read
            # its messages of D), and a reader's dead letter of a landing file of D
            # (untagged ones predate partition keys): their rows leave with the old folder,
            # so a record fixed in the new version is never in both, and none twice.
            source, day = rebuild.source, rebuild.partition_key
            of_source = sa.select(splits.c.id).where(splits.c.source == source)
            landing = sa.select(splits.c.id).where(
                splits.c.source == source, splits.c.partition_key == day
            )
            conn.execute(
                sa.delete(dead_letters).where(
                    dead_letters.c.rebuild_id.is_distinct_from(rebuild.id),
                    sa.or_(
                        sa.and_(
                            dead_letters.c.split_id.in_(of_source),
                            dead_letters.c.partition_key == day,
                        ),
                        sa.and_(
                            dead_letters.c.split_id.in_(landing),
                            dead_letters.c.partition_key.is_(None),
                        ),
                    ),
                )
            )
            # Step 2: D's counts and, if it was complete, its next completion generation.
            replace_partition(conn, rebuild.id)
            # Step 3: the members leave the rebuild; DONE.
            conn.execute(
                sa.update(splits)
                .where(splits.c.rebuild_id == rebuild.id)
                .values(rebuild_id=None, rebuild_day=None, rebuild_fresh=False)
            )
            conn.execute(
                sa.update(partition_rebuilds)
                .where(partition_rebuilds.c.id == rebuild.id)
                .values(status=RebuildStatus.DONE, swapped_at=sa.func.now())
            )
            # Step 4: HELD splits no unfinished rebuild holds any more join the pool.
            conn.execute(
                sa.update(splits)
                .where(
                    splits.c.source == source,
                    splits.c.status == SplitStatus.HELD,
                    ~holds(splits.c.source, splits.c.partition_key),
                )
                .values(status=SplitStatus.UNASSIGNED)
            )

    @staticmethod
    def _status(conn: Connection, rebuild_id: int) -> str | None:
        return conn.execute(
            sa.select(partition_rebuilds.c.status)
            .where(partition_rebuilds.c.id == rebuild_id)
            .with_for_update()
        ).scalar_one_or_none()
