"""A pipeline's dead letters, listed: how many per day and reason, and the records themselves.

A dead letter's day is the one it counts on everywhere else (the Dagster checks'
accounting, ``partition_stats``): the day its commit tagged it with
(``dead_letters.partition_key``: a step's, its record's event day; a reader's, its landing
day; a Kafka main line's, its message timestamp's), else, untagged, its split's day. An
output that is not partitioned by day has no days: every dead letter then has ``day`` None.

Threading: blocks on the database; call from the CLI or any other control-path thread.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import date, datetime

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from enumerator_service._schema import dead_letters, splits

__all__ = ["DeadLetterListing", "ListedDeadLetter", "list_dead_letters"]


@dataclass(frozen=True, slots=True)
class ListedDeadLetter:
    id: int
    day: date | None
    split_id: int | None
    uri: str
    offset: int
    reason: str
    #: The rejected input as stored (its first 4 KiB at most).
    raw: bytes
    run_id: str | None
    created_at: datetime


@dataclass(frozen=True, slots=True)
class DeadLetterListing:
    source: str
    #: Every dead letter that matches the filters.
    total: int
    #: (day, reason category — the reason up to its first ':', count), by day then count.
    by_day: list[tuple[date | None, str, int]]
    #: The first ``limit`` of them, by day, then file (or partition) and offset.
    shown: list[ListedDeadLetter]


def _like_escaped(text: str) -> str:
    """``text`` matched literally by ``ILIKE … ESCAPE '\\'`` (its wildcards escaped)."""
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


def list_dead_letters(
    engine: Engine,
    source: str,
    *,
    days: Sequence[date] | None = None,
    reason: str | None = None,
    limit: int | None = 20,
) -> DeadLetterListing:
    """The dead letters of ``source`` counting on ``days`` (None: every day, and those with
    no day), whose reason contains ``reason`` (case-insensitive; None: any), the first
    ``limit`` of them in full (None: all)."""
    day = sa.func.coalesce(dead_letters.c.partition_key, splits.c.partition_key).label("day")
    category = sa.func.split_part(dead_letters.c.reason, ":", 1).label("category")
    joined = dead_letters.outerjoin(splits, dead_letters.c.split_id == splits.c.id)
    where: list[sa.ColumnElement[bool]] = [dead_letters.c.source == source]
    if days is not None:
        where.append(day.in_(list(days)))
    if reason:
        where.append(dead_letters.c.reason.ilike(f"%{_like_escaped(reason)}%", escape="\\"))
    count = sa.func.count()
    with engine.connect() as conn:
        by_day = [
            (row.day, str(row.category), int(row.n))
            for row in conn.execute(
                sa.select(day, category, count.label("n"))
                .select_from(joined)
                .where(*where)
                .group_by(day, category)
                .order_by(day.asc().nulls_first(), count.desc(), category)
            )
        ]
        rows = conn.execute(
            sa.select(
                dead_letters.c.id,
                day,
                dead_letters.c.split_id,
                dead_letters.c.uri,
                dead_letters.c.offset,
                dead_letters.c.reason,
                dead_letters.c.raw,
                dead_letters.c.run_id,
                dead_letters.c.created_at,
            )
            .select_from(joined)
            .where(*where)
            .order_by(
                day.asc().nulls_first(),
                dead_letters.c.uri,
                dead_letters.c.offset,
                dead_letters.c.id,
            )
            .limit(limit)
        ).all()
    shown = [
        ListedDeadLetter(
            r.id, r.day, r.split_id, r.uri, r.offset, r.reason, bytes(r.raw), r.run_id, r.created_at
        )
        for r in rows
    ]
    return DeadLetterListing(source, sum(n for _, _, n in by_day), by_day, shown)
