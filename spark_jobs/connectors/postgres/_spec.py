"""The spec of the Postgres table sink: what a user writes in a pipeline definition."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["PostgresSink"]


@dataclass(frozen=True)
class PostgresSink:
    """Rows in the Postgres table ``table`` (``"schema.table"``; created with the output's
    columns, plus ``dt`` for a day-partitioned source, when missing), committed in the same
    transaction as the checkpoint that covers them.

    ``upsert_key``: columns with a unique index; a row replaces the row with its key (the
    last one staged wins within a checkpoint). None: rows are appended.
    """

    table: str
    upsert_key: Sequence[str] | None = None
