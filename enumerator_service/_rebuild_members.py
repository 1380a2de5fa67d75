"""Which splits a rebuild of a day re-reads, and when a rebuild cannot start (see
``enumerator_service._rebuilds``, "Rebuilds by event day").

The members of a rebuild of day D are the splits landing on D plus every split that fed D
(``split_partitions``: rows or dead letters of D committed from it), plus the members of an
unfinished rebuild of D that this one replaces. With event-day partitions the swap replaces
D's whole folder, so every source of D's records must be a member, and no other split may
still write to D before the swap.

Threading: functions run inside the caller's transaction (the source's rebuild lock held).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import date

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from enumerator_service._schema import (
    ACTIVE_SPLIT,
    UNREAD_SPLIT,
    RebuildStatus,
    SplitStatus,
    partition_rebuilds,
    split_partitions,
    splits,
)

__all__ = [
    "CrossDayRebuildError",
    "PartitionBusyError",
    "hold_unread",
    "members",
    "older_versions",
    "processed_days",
]


class PartitionBusyError(RuntimeError):
    """A partition to rebuild is being read by another live run."""


class CrossDayRebuildError(RuntimeError):
    """A day to rebuild cannot be rebuilt now because of files of other landing days: two
    requested days share a file, or a file that does (or may) feed the day is not read to
    the end. Raised before anything changed; the message is one line."""

    def __init__(self, source: str, partition_key: date, reason: str) -> None:
        super().__init__(f"partition {partition_key} of {source!r}: {reason}")
        self.source, self.partition_key = source, partition_key


def _read_before() -> sa.ColumnElement[bool]:
    # A split some run read (or began to): its output is in the old generation.
    return sa.or_(
        splits.c.status.not_in((SplitStatus.UNASSIGNED, SplitStatus.HELD)),
        splits.c.committed_offset.is_not(None),
        splits.c.rebuild_id.is_not(None),
    )


def _current_version() -> sa.ColumnElement[bool]:
    # A rebuild reads the files as they are now: never an older version of a changed file
    # (its reader would refuse it; the swap drops that version's rows with the old folder).
    newer = sa.alias(splits, "newer")
    return sa.and_(
        splits.c.status != SplitStatus.SUPERSEDED,
        ~sa.exists().where(
            newer.c.source == splits.c.source,
            newer.c.uri == splits.c.uri,
            newer.c.file_version > splits.c.file_version,
        ),
    )


def older_versions(source: str) -> sa.Select[tuple[int]]:
    """The ids of ``source``'s splits cut from an older version of a changed file: no rebuild
    reads them, and a day's rebuild drops their rows (with the old folder) and their dead
    letters of that day."""
    return sa.select(splits.c.id).where(splits.c.source == source, ~_current_version())


def processed_days(conn: Connection, source: str, days: Sequence[date]) -> list[date]:
    """The days of ``days`` holding output (or a rebuild) of an earlier run: a landing split
    that was read, or any split that fed them."""
    landed = sa.select(splits.c.partition_key).where(
        splits.c.source == source, splits.c.partition_key.in_(list(days)), _read_before()
    )
    fed = (
        sa.select(split_partitions.c.partition_key)
        .join(splits, splits.c.id == split_partitions.c.split_id)
        .where(splits.c.source == source, split_partitions.c.partition_key.in_(list(days)))
    )
    return sorted(set(conn.execute(sa.union(landed, fed)).scalars()))


def hold_unread(conn: Connection, source: str, days: Sequence[date]) -> None:
    """Event-day sources: every split of the source that no run has read yet is HELD until
    the swap (any of them may hold rows of the day; read after the swap, they add them to
    the new generation, counted as usual) — except the files of the ``days`` rebuilt, which
    are their rebuilds' *fresh* members."""
    fed = sa.select(split_partitions.c.split_id)
    conn.execute(
        sa.update(splits)
        .where(
            splits.c.source == source,
            splits.c.partition_key.not_in(list(days)),
            splits.c.status == SplitStatus.UNASSIGNED,
            ~_read_before(),
            splits.c.id.not_in(fed),
        )
        .values(status=SplitStatus.HELD)
    )


def members(
    conn: Connection,
    source: str,
    days: Sequence[date],
    run_id: str,
    *,
    event_days: bool,
    fed: bool = True,
) -> tuple[dict[date, list[int]], set[int]]:
    """The member split ids of a rebuild of each of ``days`` (processed ones), after the
    checks that nothing else reads them or may still write to the days; and which members
    are fresh (event days: a file of the day no run had read). ``fed`` False: only the
    splits of the day itself (not the splits that fed it)."""
    out: dict[date, list[int]] = {}
    owner: dict[int, date] = {}
    for day in days:
        replaced = sa.select(partition_rebuilds.c.id).where(
            partition_rebuilds.c.source == source,
            partition_rebuilds.c.partition_key == day,
            partition_rebuilds.c.status == RebuildStatus.BUILDING,
        )
        fed_day = sa.select(split_partitions.c.split_id).where(
            split_partitions.c.partition_key == day
        )
        ids = conn.execute(
            sa.select(splits.c.id)
            .where(
                splits.c.source == source,
                sa.or_(
                    splits.c.partition_key == day,
                    splits.c.id.in_(fed_day) if fed else sa.false(),
                    splits.c.rebuild_id.in_(replaced),
                ),
                _current_version(),
            )
            .order_by(splits.c.id)
        ).scalars()
        out[day] = list(ids)
        for split_id in out[day]:
            if split_id in owner:  # one rebuild per split: it writes one day's records
                raise CrossDayRebuildError(
                    source,
                    owner[split_id],
                    f"shares input (split {split_id}) with partition {day}: rebuild them in "
                    "separate runs, one day each",
                )
            owner[split_id] = day
        if not fed:
            _check_own_splits_cover(conn, source, day, out[day])
    _check_busy(conn, source, out, run_id)
    if not event_days:
        return out, set()
    fresh = set(
        conn.execute(
            sa.select(splits.c.id).where(
                splits.c.id.in_(list(owner)),
                # Never read, so in no split_partitions: a member through its landing day.
                splits.c.partition_key.in_(list(out)),
                ~_read_before(),
            )
        ).scalars()
    )
    _check_other_days(conn, source, out, fresh)
    return out, fresh


def _check_own_splits_cover(conn: Connection, source: str, day: date, ids: list[int]) -> None:
    """A rebuild from the day's own splits (``fed`` False: Kafka's time-bounded day splits,
    paths ``<stream>@<day>``) replaces every row of the day, so its members must reach the
    offsets the day's committed rows were read from: per stream (the path before ``@``) a
    member's range must overlap every split that fed the day. Else (the broker's
    ``offsets_for_times`` resolved the day to an empty range or one that misses it: retention,
    producer timestamps that are not event time) the swap would replace committed rows with
    none — refused in one line, before anything changed."""
    fed_day = sa.select(split_partitions.c.split_id).where(split_partitions.c.partition_key == day)
    fed = conn.execute(
        sa.select(
            splits.c.uri,
            splits.c.start_offset,
            sa.func.coalesce(splits.c.end_offset, splits.c.committed_offset).label("end"),
        )
        .where(splits.c.source == source, splits.c.id.in_(fed_day))
        .order_by(splits.c.uri, splits.c.start_offset)
    ).all()
    own = conn.execute(
        sa.select(splits.c.uri, splits.c.start_offset, splits.c.end_offset).where(
            splits.c.id.in_(ids)
        )
    ).all()
    for split in fed:
        stream, end = split.uri.partition("@")[0], split.end
        if end is not None and end <= split.start_offset:
            continue  # read nothing: no row of the day came from it
        ranges = [o for o in own if o.uri.partition("@")[0] == stream]
        top = float("inf") if end is None else end
        if not any(
            o.end_offset is not None
            and max(o.start_offset, split.start_offset) < min(o.end_offset, top)
            for o in ranges
        ):
            covered = ", ".join(f"[{o.start_offset}, {o.end_offset})" for o in ranges) or "none"
            read = f"[{split.start_offset}, {'end' if end is None else end})"
            raise CrossDayRebuildError(
                source,
                day,
                f"its committed rows were read from {stream} offsets {read} but its day "
                f"splits of {stream} cover {covered} (the broker's offsets_for_times "
                "resolved the day to a range that misses them): nothing replaced",
            )


def _check_busy(conn: Connection, source: str, out: dict[date, list[int]], run_id: str) -> None:
    # Nobody else may be reading a member (an expired lease holds nothing).
    for day, ids in out.items():
        busy = conn.execute(
            sa.select(splits.c.run_id)
            .where(
                splits.c.id.in_(ids),
                splits.c.status.in_(ACTIVE_SPLIT),
                splits.c.run_id != run_id,
                splits.c.lease_expires_at > sa.func.now(),
            )
            .limit(1)
        ).first()
        if busy is not None:
            raise PartitionBusyError(
                f"partition {day} of {source!r} is being read by run {busy.run_id}; "
                "rebuild it once that run has ended"
            )


def _check_other_days(
    conn: Connection, source: str, out: dict[date, list[int]], fresh: set[int]
) -> None:
    """Every member must be read to the end (COMPLETED, in no other rebuild) unless an
    unfinished rebuild of the same day already holds it: re-read from scratch, a member
    writes only the day's rows, so its other days' rows must all be written already. And no
    other split may be half read (never-read ones are HELD): the swap replaces the day's
    whole folder, so rows of the day such a split wrote before the swap would be lost."""
    all_members = [split_id for ids in out.values() for split_id in ids]
    for day, ids in out.items():
        replaced = sa.select(partition_rebuilds.c.id).where(
            partition_rebuilds.c.source == source,
            partition_rebuilds.c.partition_key == day,
            partition_rebuilds.c.status == RebuildStatus.BUILDING,
        )
        unread_member = sa.and_(
            splits.c.id.in_(ids),
            splits.c.id.not_in(list(fresh)),
            sa.or_(splits.c.status != SplitStatus.COMPLETED, splits.c.rebuild_id.is_not(None)),
            sa.or_(splits.c.rebuild_id.is_(None), splits.c.rebuild_id.not_in(replaced)),
        )
        unread_other = sa.and_(  # (never-read ones are HELD by now: hold_unread)
            splits.c.source == source,
            splits.c.id.not_in(all_members),
            splits.c.status.in_(UNREAD_SPLIT),  # may still write rows of the day
            splits.c.status != SplitStatus.HELD,
        )
        blocking = conn.execute(
            sa.select(splits.c.uri, splits.c.status, splits.c.partition_key)
            .where(sa.or_(unread_member, unread_other))
            .order_by(splits.c.id)
            .limit(1)
        ).first()
        if blocking is not None:
            # What to do depends on why it is unread: a quarantined file waits for a retry.
            todo = (
                "put it back with 'sluice retry' (it is quarantined), then rebuild"
                if blocking.status == SplitStatus.FAILED
                else "run the pipeline to read it first"
            )
            raise CrossDayRebuildError(
                source,
                day,
                f"file {blocking.uri} (landing day {blocking.partition_key}, "
                f"{blocking.status.lower()}) is not read to the end and may hold rows of it: "
                f"{todo}",
            )
