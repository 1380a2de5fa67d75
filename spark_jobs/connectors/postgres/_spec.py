"""The spec of the Postgres table sink: what a user writes in a pipeline definition."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["PostgresSink"]


@dataclass(frozen=True)
class PostgresSink:
    """Rows in a Postgres table, committed in the same transaction as the checkpoint that
    covers them.

    The table is created when missing, with the output's columns (plus `dt` for a
    day-partitioned source); an existing table must have those columns and, for an upsert,
    a unique index on the key.

    ```python
    from spark_jobs import PostgresSink

    sink = PostgresSink("analytics.user_totals", upsert_key=["user_id"])
    ```

    Args:
        table: `"schema.table"`, or `"table"` in schema `public`.
        upsert_key: Output fields with a unique index: a row replaces the row with its key
            unless that row's event time is later (the latest event of a key wins, then the
            last one processed), and rebuilding a day writes its
            rows again. `None`: rows are appended, and rebuilding a day already processed
            only processes its new files.
    """

    table: str
    upsert_key: Sequence[str] | None = None
