"""Partition completeness: the run watermark of a completed checkpoint, the committed counts
per output partition, and the partitions a checkpoint completes — all written inside the
checkpoint's completion transaction, so a completion exists exactly when its checkpoint does.

Rules (see README "Event time and partition completeness"):

- The run watermark of a checkpoint comes from its subtasks' snapshots
  (``_run_watermark``: the minimum over active subtasks, idle ones left out, closed ones
  +infinity; the greatest reached when every open subtask is idle and the run holds no
  unread split). It is stored per run in ``run_watermarks`` and never moves backwards: a
  subtask restored from an older state cannot un-complete a day.
- An output partition (a UTC day D, ``[D 00:00, D+1 00:00)``) of a source is complete at a
  checkpoint of run R when (1) R's run watermark >= D+1 00:00 UTC, (2) the partition has
  committed output not covered by a completion (``partition_stats.open``), and (3) no split
  of the source whose landing day is <= D is still waiting or being read (UNASSIGNED,
  ASSIGNED, READING, HELD) in any run: those splits may still carry records of D, and their
  readers' watermarks are not part of R's. Quarantined (FAILED) splits do not hold a day
  back (a poison file would block it for ever); COMPLETED ones are committed.
- The check is source-wide and serialised by an advisory transaction lock per source, so two
  runs finishing the splits of one day concurrently cannot both miss (each would see the
  other's splits still READING) nor both record it: the second to lock sees the first's
  commit. A completion row is one generation; a partition reopened by late rows
  (``late_records="reopen"``) completes again as the next generation.

Threading: blocking database functions; call from the coordinator or a writer thread.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.engine import Connection, Row

from enumerator_service._schema import (
    UNREAD_SPLIT,
    partition_completions,
    partition_rebuilds,
    partition_stats,
    run_watermarks,
    split_partitions,
    splits,
)

__all__ = [
    "DETAIL",
    "END_OF_INPUT",
    "NO_WATERMARK",
    "PartitionCompletion",
    "add_partition_counts",
    "complete_partitions",
    "completed_partitions",
    "lock_source",
    "merge_partition_counts",
    "partition_end",
    "record_run_watermark",
]

#: +infinity: a subtask (or run) whose input ended.
END_OF_INPUT = datetime.max.replace(tzinfo=UTC)
#: -infinity: a subtask that has no watermark yet holds the run's back.
NO_WATERMARK = datetime.min.replace(tzinfo=UTC)

#: The counters of one partition in ``Acknowledgement.partitions`` / ``partition_counts``:
#: rows written, dead letters, late records, and the rows that came from files of another
#: landing day (``foreign_rows``).
COUNTERS = ("rows", "dead_letters", "late_records", "foreign_rows")

#: The key of ``partition_counts`` (beside the days) with what rebuilds by event day need,
#: committed with the counts: ``{"splits": {day: [split id]}`` (the splits that fed each day),
#: ``"rebuilds": {rebuild id: {"rows", "dead_letters", "foreign_rows"}}`` (a rebuild's
#: members' counts for its day, not in ``partition_stats``), ``"dead_letters": [[split id,
#: offset, day]]`` (the partition each dead letter counts on)``}``.
DETAIL = "detail"
_REBUILD_COUNTERS = ("rows", "dead_letters", "foreign_rows")


@dataclass(frozen=True, slots=True)
class PartitionCompletion:
    """One ``partition_completions`` row, the one type on both sides: written by
    :func:`complete_partitions` in a checkpoint's transaction, read and marked by the
    Dagster reporter (``_completions``). ``watermark`` None: completed at end of input;
    ``reported_at`` None: Dagster has not been told yet."""

    source: str
    partition_key: date
    generation: int
    completed_at: datetime
    run_id: str
    checkpoint_id: int
    watermark: datetime | None
    rows: int
    dead_letters: int
    late_records: int
    reported_at: datetime | None = None

    @classmethod
    def from_row(cls, row: Row[Any]) -> PartitionCompletion:
        """From a ``partition_completions`` row (every column selected)."""
        return cls(**row._mapping)


def partition_end(day: date) -> datetime:
    """The end of output partition ``day``: the next day, 00:00 UTC (exclusive)."""
    return datetime.combine(day + timedelta(days=1), time(), tzinfo=UTC)


def merge_partition_counts(
    into: dict[str, dict[str, Any]], counts: Mapping[str, Mapping[str, Any]] | None
) -> dict[str, dict[str, Any]]:
    """Adds ``counts`` (``{"YYYY-MM-DD": {counter: n}}``, counters :data:`COUNTERS`, and
    optionally :data:`DETAIL`) into ``into`` and returns it (missing counters are 0)."""
    for day, values in (counts or {}).items():
        if day == DETAIL:
            _merge_detail(into.setdefault(DETAIL, {}), values)
            continue
        date.fromisoformat(day)  # a malformed key fails here, not inside SQL
        total = into.setdefault(day, dict.fromkeys(COUNTERS, 0))
        for name in COUNTERS:
            total[name] += int(values.get(name, 0))
    return into


def _merge_detail(into: dict[str, Any], detail: Mapping[str, Any]) -> None:
    fed: dict[str, list[int]] = into.setdefault("splits", {})
    for day, ids in detail.get("splits", {}).items():
        fed[day] = sorted({*fed.get(day, ()), *ids})
    tallies: dict[str, dict[str, int]] = into.setdefault("rebuilds", {})
    for rebuild_id, values in detail.get("rebuilds", {}).items():
        total = tallies.setdefault(str(rebuild_id), dict.fromkeys(_REBUILD_COUNTERS, 0))
        for name in _REBUILD_COUNTERS:
            total[name] += int(values.get(name, 0))
    into.setdefault("dead_letters", []).extend(detail.get("dead_letters", ()))


# One JSON parameter, not a VALUES list: SQLAlchemy compiles a VALUES clause of a few
# thousand rows in ~0.15 s, on the completion's critical path (issue 15).
_TAG_DEAD_LETTERS = sa.text(
    """
    UPDATE sluice.dead_letters AS d SET partition_key = l.day
    FROM jsonb_to_recordset(CAST(:letters AS jsonb))
         AS l(split_id bigint, "offset" bigint, day date)
    WHERE d.split_id = l.split_id AND d."offset" = l."offset"
    """
)


def add_partition_counts(
    conn: Connection, source: str, counts: Mapping[str, Mapping[str, Any]]
) -> None:
    """Inside the transaction that commits the output: add its counts to ``partition_stats``
    (and its :data:`DETAIL` to ``split_partitions``, the rebuilds' counts and the dead
    letters' partitions: call it after the dead letters were inserted).

    A partition with written rows is (re)opened: a completed partition that gets rows again
    (late records under ``reopen``) needs a new completion. Dead letters alone open only a
    partition that never completed (a late record dead-lettered does not reopen its day).
    """
    lock_source(conn, source)
    for day, values in sorted(counts.items()):
        if day == DETAIL:
            continue
        rows, dead, late, foreign = (int(values.get(name, 0)) for name in COUNTERS)
        stmt = insert(partition_stats).values(
            source=source,
            partition_key=date.fromisoformat(day),
            rows=rows,
            dead_letters=dead,
            late_records=late,
            foreign_rows=foreign,
        )
        table = partition_stats
        conn.execute(
            stmt.on_conflict_do_update(
                index_elements=["source", "partition_key"],
                set_={
                    "rows": table.c.rows + stmt.excluded.rows,
                    "dead_letters": table.c.dead_letters + stmt.excluded.dead_letters,
                    "late_records": table.c.late_records + stmt.excluded.late_records,
                    "foreign_rows": table.c.foreign_rows + stmt.excluded.foreign_rows,
                    "open": sa.or_(table.c.open, table.c.generation == 0, stmt.excluded.rows > 0),
                    "updated_at": sa.func.now(),
                },
            )
        )
    if DETAIL in counts:
        _add_detail(conn, counts[DETAIL])


def _add_detail(conn: Connection, detail: Mapping[str, Any]) -> None:
    fed = [
        {"split_id": int(split_id), "partition_key": date.fromisoformat(day)}
        for day, ids in sorted(detail.get("splits", {}).items())
        for split_id in ids
    ]
    if fed:
        conn.execute(insert(split_partitions).values(fed).on_conflict_do_nothing())
    for rebuild_id, values in sorted(detail.get("rebuilds", {}).items()):
        table = partition_rebuilds
        conn.execute(
            sa.update(table)
            .where(table.c.id == int(rebuild_id))
            .values({name: table.c[name] + int(values.get(name, 0)) for name in _REBUILD_COUNTERS})
        )
    # The dead letters of this commit were inserted before: tag each with its partition.
    letters = detail.get("dead_letters", ())
    if letters:
        tagged = [
            {"split_id": int(s), "offset": int(o), "day": date.fromisoformat(d).isoformat()}
            for s, o, d in letters
        ]
        conn.execute(_TAG_DEAD_LETTERS, {"letters": json.dumps(tagged)})


def lock_source(conn: Connection, source: str) -> None:
    """Serialise the partition bookkeeping of one source until the transaction ends.

    Every write of ``partition_stats`` and every completion check takes it first (re-entrant
    within a transaction), so two runs' checkpoints never deadlock on stats rows and the
    second completion check sees the first one's committed splits (module docstring).
    """
    conn.execute(
        sa.select(
            sa.func.pg_advisory_xact_lock(
                sa.func.hashtext("sluice.partition_completions"), sa.func.hashtext(source)
            )
        )
    )


def record_run_watermark(
    conn: Connection, run_id: str, source: str | None, checkpoint_id: int, watermark: datetime
) -> datetime:
    """Store the run watermark of a completed checkpoint; returns the effective one: the
    greatest stored so far (a run watermark never moves backwards)."""
    finished = watermark >= END_OF_INPUT
    value = None if finished or watermark <= NO_WATERMARK else watermark
    stmt = insert(run_watermarks).values(
        run_id=run_id,
        source=source,
        checkpoint_id=checkpoint_id,
        watermark=value,
        finished=finished,
    )
    table = run_watermarks
    row = conn.execute(
        stmt.on_conflict_do_update(
            index_elements=["run_id"],
            set_={
                "checkpoint_id": stmt.excluded.checkpoint_id,
                # GREATEST ignores NULLs: -infinity never replaces a watermark.
                "watermark": sa.func.greatest(table.c.watermark, stmt.excluded.watermark),
                "finished": sa.or_(table.c.finished, stmt.excluded.finished),
                "updated_at": sa.func.now(),
            },
        ).returning(table.c.watermark, table.c.finished)
    ).one()
    if row.finished:
        return END_OF_INPUT
    return NO_WATERMARK if row.watermark is None else row.watermark.astimezone(UTC)


def complete_partitions(
    conn: Connection,
    *,
    source: str,
    run_id: str,
    checkpoint_id: int,
    watermark: datetime,
) -> list[PartitionCompletion]:
    """Inside the checkpoint's completion transaction: record every partition of ``source``
    that ``watermark`` (the run's, effective) completes, each once (module rules)."""
    if watermark <= NO_WATERMARK:
        return []
    lock_source(conn, source)
    stats = partition_stats
    unfinished = (
        sa.select(sa.literal(1))
        .where(
            splits.c.source == source,
            splits.c.partition_key <= stats.c.partition_key,
            splits.c.status.in_(UNREAD_SPLIT),
        )
        .exists()
    )
    query = sa.select(stats).where(stats.c.source == source, stats.c.open, ~unfinished)
    if watermark < END_OF_INPUT:
        # D is complete when D+1 00:00 <= watermark, i.e. D < the watermark's UTC day.
        query = query.where(stats.c.partition_key < watermark.astimezone(UTC).date())
    stored = None if watermark >= END_OF_INPUT else watermark
    done: list[PartitionCompletion] = []
    for row in conn.execute(query.order_by(stats.c.partition_key).with_for_update()).all():
        values = {
            "source": source,
            "partition_key": row.partition_key,
            "generation": row.generation + 1,
            "run_id": run_id,
            "checkpoint_id": checkpoint_id,
            "watermark": stored,
            "rows": row.rows,
            "dead_letters": row.dead_letters,
            "late_records": row.late_records,
        }
        table = partition_completions
        inserted = conn.execute(
            insert(table).values(**values).on_conflict_do_nothing().returning(*table.c)
        ).first()
        if inserted is None:  # already recorded (cannot happen under the lock; be total)
            inserted = conn.execute(
                sa.select(table).where(
                    table.c.source == source,
                    table.c.partition_key == row.partition_key,
                    table.c.generation == values["generation"],
                )
            ).one()
        completion = PartitionCompletion.from_row(inserted)
        conn.execute(
            sa.update(stats)
            .where(stats.c.source == source, stats.c.partition_key == row.partition_key)
            .values(generation=completion.generation, open=False, updated_at=sa.func.now())
        )
        done.append(completion)
    return done


def completed_partitions(conn: Connection, source: str) -> frozenset[date]:
    """The partitions of ``source`` with at least one committed completion: what a task
    judges lateness against (loaded at subtask start, refreshed at each checkpoint)."""
    return frozenset(
        conn.execute(
            sa.select(partition_completions.c.partition_key)
            .where(partition_completions.c.source == source)
            .distinct()
        ).scalars()
    )
