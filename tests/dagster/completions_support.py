"""Test-only stand-in for migration 0008 (the completeness part of issue 14): create
``sluice.partition_completions`` and insert completion rows directly, as the checkpoint
commit will.

Once 0008 lands, ``open_platform(migrate=True)`` creates the table and
:func:`create_completions_table` finds it there (``checkfirst``).
"""

from __future__ import annotations

from datetime import UTC, date, datetime, time, timedelta
from typing import Any

import sqlalchemy as sa

from enumerator_service._completions import PartitionCompletion, partition_completions

__all__ = ["create_completions_table", "insert_completion", "reported_at"]


def create_completions_table(engine: sa.Engine) -> None:
    with engine.begin() as conn:
        partition_completions.create(conn, checkfirst=True)


def insert_completion(
    engine: sa.Engine, source: str, day: date, generation: int = 1, **fields: Any
) -> PartitionCompletion:
    """A completion of ``day`` as a checkpoint commit writes it (watermark: just past the day)."""
    end = datetime.combine(day + timedelta(days=1), time(), tzinfo=UTC)
    row: dict[str, Any] = {
        "source": source,
        "partition_key": day,
        "generation": generation,
        "completed_at": end + timedelta(minutes=5, seconds=generation),
        "run_id": f"run-{generation}",
        "checkpoint_id": 3,
        "watermark": end + timedelta(seconds=1),
        "rows": 100 * generation,
        "dead_letters": 2,
        "late_records": generation - 1,
        **fields,
    }
    with engine.begin() as conn:
        conn.execute(partition_completions.insert().values(**row))
    return PartitionCompletion(**row)


def reported_at(engine: sa.Engine, source: str) -> dict[tuple[date, int], datetime | None]:
    t = partition_completions
    with engine.connect() as conn:
        rows = conn.execute(
            sa.select(t.c.partition_key, t.c.generation, t.c.reported_at).where(
                t.c.source == source
            )
        ).all()
    return {(r.partition_key, r.generation): r.reported_at for r in rows}
