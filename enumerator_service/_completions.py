"""Completed output partitions (``sluice.partition_completions``) as the reporter reads them.

The checkpoint commit writes one row per (source, partition, generation) in the same
transaction as the checkpoint that completed the partition (``_schema.partition_completions``,
migration 0008); generation 2, 3, ... are a partition reopened by late records and completed
again.

``reported_at`` is the reporter's mark: NULL until the partition's completion is in Dagster.
Marking is idempotent (``WHERE reported_at IS NULL``) so two reporters never both "win".

Functions here open their own connections from the engine they are given and are safe to call
from any thread.
"""

from __future__ import annotations

from dataclasses import dataclass

import sqlalchemy as sa

from enumerator_service._completeness import PartitionCompletion
from enumerator_service._schema import SCHEMA, partition_completions

__all__ = [
    "CompletionCounts",
    "PartitionCompletion",
    "completion_counts",
    "completions_table_exists",
    "mark_reported",
    "partition_completions",
    "unreported_completions",
]


def completions_table_exists(engine: sa.Engine) -> bool:
    """Whether migration 0008 (the completeness part) has created the table yet."""
    with engine.connect() as conn:
        found = conn.execute(
            sa.text("SELECT to_regclass(:name)"), {"name": f"{SCHEMA}.partition_completions"}
        ).scalar()
    return found is not None


def unreported_completions(engine: sa.Engine, source: str, limit: int) -> list[PartitionCompletion]:
    """At most ``limit`` completions of ``source`` not reported yet, oldest completion first
    (a partition's generations in order)."""
    t = partition_completions
    query = (
        sa.select(t)
        .where(t.c.source == source, t.c.reported_at.is_(None))
        .order_by(t.c.completed_at, t.c.partition_key, t.c.generation)
        .limit(limit)
    )
    with engine.connect() as conn:
        return [PartitionCompletion.from_row(row) for row in conn.execute(query)]


def mark_reported(engine: sa.Engine, completion: PartitionCompletion) -> bool:
    """Mark one completion reported; False when it already was (by another reporter)."""
    t = partition_completions
    with engine.begin() as conn:
        done = conn.execute(
            t.update()
            .where(
                t.c.source == completion.source,
                t.c.partition_key == completion.partition_key,
                t.c.generation == completion.generation,
                t.c.reported_at.is_(None),
            )
            .values(reported_at=sa.func.now())
        )
    return done.rowcount == 1


@dataclass(frozen=True, slots=True)
class CompletionCounts:
    """How many of a source's partitions are complete, and how many completions Dagster has
    not been told of yet (``sluice status``)."""

    partitions: int
    generations: int
    unreported: int


def completion_counts(conn: sa.Connection, source: str) -> CompletionCounts | None:
    """``source``'s completion counts; None before the completions table exists."""
    exists = conn.execute(
        sa.text("SELECT to_regclass(:name)"), {"name": f"{SCHEMA}.partition_completions"}
    ).scalar()
    if exists is None:
        return None
    t = partition_completions
    partitions, generations, unreported = conn.execute(
        sa.select(
            sa.func.count(sa.distinct(t.c.partition_key)),
            sa.func.count(),
            sa.func.count().filter(t.c.reported_at.is_(None)),
        ).where(t.c.source == source)
    ).one()
    return CompletionCounts(int(partitions), int(generations), int(unreported))
