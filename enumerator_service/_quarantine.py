"""Quarantined (poison) splits: listing them and putting them back.

A split whose content failed ``SLUICE_SPLIT_MAX_ATTEMPTS`` attempts is FAILED (see
``enumerator_service._checkpoint_commit``): no run assigns or reads it, the pipeline goes on
without it. ``retry`` puts such splits back in the pool (UNASSIGNED) with their failure count
reset; they resume at their committed offset, so records committed before the failure are
not read twice.

Threading: every function blocks on the database.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import date, datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from enumerator_service._schema import SplitStatus, splits

__all__ = ["QuarantinedSplit", "quarantined", "retry_splits"]


@dataclass(frozen=True, slots=True)
class QuarantinedSplit:
    """A FAILED split: where it is, how often it failed, why, and the last error."""

    id: int
    source: str
    uri: str
    failures: int
    reason: str
    last_error: str
    failed_at: datetime | None
    partition_key: date | None = None

    @classmethod
    def of(cls, row: Any) -> QuarantinedSplit:
        """From a row of the splits table (``partition_key`` optional)."""
        return cls(
            id=row.id,
            source=row.source,
            uri=row.uri,
            failures=row.failures,
            reason=row.failure_reason or "",
            last_error=row.last_error or "",
            failed_at=row.failed_at,
            partition_key=getattr(row, "partition_key", None),
        )

    def line(self, limit: int = 300) -> str:
        """One line: file, reason, attempts and last error, at most ``limit`` characters (the
        error was stored redacted and bounded by the reader)."""
        text = f"{self.uri} — {self.reason} after {self.failures} attempts: {self.last_error}"
        flat = " ".join(text.split())
        return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def quarantined(
    engine: Engine,
    source: str | None = None,
    *,
    days: Sequence[date] | None = None,
    limit: int = 1000,
) -> list[QuarantinedSplit]:
    """FAILED splits (of ``source``, of partitions ``days``), oldest failure first, at most
    ``limit``."""
    stmt = (
        sa.select(
            splits.c.id,
            splits.c.source,
            splits.c.uri,
            splits.c.failures,
            splits.c.failure_reason,
            splits.c.last_error,
            splits.c.failed_at,
            splits.c.partition_key,
        )
        .where(splits.c.status == SplitStatus.FAILED)
        .order_by(splits.c.failed_at, splits.c.id)
        .limit(limit)
    )
    if source is not None:
        stmt = stmt.where(splits.c.source == source)
    if days is not None:
        stmt = stmt.where(splits.c.partition_key.in_(list(days)))
    with engine.connect() as conn:
        rows = conn.execute(stmt).all()
    return [QuarantinedSplit.of(r) for r in rows]


def retry_splits(
    engine: Engine, split_ids: Sequence[int] | None = None, *, source: str | None = None
) -> list[QuarantinedSplit]:
    """Put FAILED splits back in the pool: the given ones (None: every FAILED split, of
    ``source`` if given). Returns the splits put back (as they were); ids that are not FAILED
    are left alone and missing from the result."""
    conditions = [splits.c.status == SplitStatus.FAILED]
    if split_ids is not None:
        conditions.append(splits.c.id.in_(list(split_ids)))
    if source is not None:
        conditions.append(splits.c.source == source)
    old = sa.alias(splits, "old")
    stmt = (
        sa.update(splits)
        .where(*conditions, old.c.id == splits.c.id)
        .values(
            status=SplitStatus.UNASSIGNED,
            failures=0,
            failure_reason=None,
            last_error=None,
            failed_at=None,
            run_id=None,
            subtask=None,
            lease_expires_at=None,
            assigned_checkpoint=None,
        )
        .returning(
            old.c.id,
            old.c.source,
            old.c.uri,
            old.c.failures,
            old.c.failure_reason,
            old.c.last_error,
            old.c.failed_at,
        )
    )
    with engine.begin() as conn:
        rows = conn.execute(stmt).all()
    return sorted((QuarantinedSplit.of(r) for r in rows), key=lambda s: s.id)
