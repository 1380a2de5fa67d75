"""A rebuild's swap, Postgres side of partition completeness: the rebuilt day's counts and
its next completion generation (see ``enumerator_service._rebuilds``, step 3).

Threading: runs inside the caller's transaction (``RebuildStore.end_swap``).
"""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.engine import Connection

from enumerator_service._completeness import lock_source
from enumerator_service._schema import (
    UNREAD_SPLIT,
    partition_completions,
    partition_rebuilds,
    partition_stats,
    splits,
)

__all__ = ["SWAP_CHECKPOINT", "replace_partition"]

#: ``partition_completions.checkpoint_id`` of a completion recorded by a rebuild's swap
#: (checkpoint ids start at 1): no checkpoint completed it, the swap did.
SWAP_CHECKPOINT = 0


def replace_partition(conn: Connection, rebuild_id: int) -> bool:
    """D's ``partition_stats`` become the rebuild's counts (no late records: a rebuild has
    none); if D was complete and no split that may still carry records of D is unfinished
    (``complete_partitions``' rule), a new completion generation is recorded with them
    (returns True), else D is left open and completes with the next checkpoint past it."""
    rebuild = conn.execute(
        sa.select(partition_rebuilds).where(partition_rebuilds.c.id == rebuild_id)
    ).one()
    source, day = rebuild.source, rebuild.partition_key
    # Step 1: the completeness lock, as every write of partition_stats takes it.
    lock_source(conn, source)
    counts = {
        "rows": rebuild.rows,
        "dead_letters": rebuild.dead_letters,
        "late_records": 0,
        "foreign_rows": rebuild.foreign_rows,
    }
    stmt = insert(partition_stats).values(source=source, partition_key=day, **counts)
    stats = conn.execute(
        stmt.on_conflict_do_update(
            index_elements=["source", "partition_key"],
            set_={**counts, "updated_at": sa.func.now()},
        ).returning(partition_stats.c.generation)
    ).one()
    # Step 2: complete again? Only a day that was complete, and nothing unread before it.
    unfinished = conn.execute(
        sa.select(
            sa.exists().where(
                splits.c.source == source,
                splits.c.partition_key <= day,
                splits.c.status.in_(UNREAD_SPLIT),
            )
        )
    ).scalar_one()
    of_day = sa.and_(partition_stats.c.source == source, partition_stats.c.partition_key == day)
    if stats.generation == 0 or unfinished:
        conn.execute(sa.update(partition_stats).where(of_day).values(open=True))
        return False
    generation = stats.generation + 1
    conn.execute(
        insert(partition_completions)
        .values(
            source=source,
            partition_key=day,
            generation=generation,
            run_id=rebuild.run_id,
            checkpoint_id=SWAP_CHECKPOINT,
            watermark=None,
            rows=rebuild.rows,
            dead_letters=rebuild.dead_letters,
            late_records=0,
        )
        .on_conflict_do_nothing()
    )
    conn.execute(sa.update(partition_stats).where(of_day).values(generation=generation, open=False))
    return True
