"""The spec of the Postgres table source: what a user writes in a pipeline definition."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from spark_jobs.pipeline._sources import LatePolicy
from spark_jobs.pipeline._types import Duration, TypeSpec

__all__ = ["TableSource"]


@dataclass(frozen=True)
class TableSource:
    """Rows of a Postgres table, read in ranges of its integer `key` column.

    The first discovery registers splits (`[low, high)` key ranges of about
    `rows_per_split` rows) over the keys present; later ones register ranges of keys
    appended above the highest one seen, so an append-only table is read continuously. Rows
    inserted below the highest key seen, and updates, are not seen. The output is
    unpartitioned.

    ```python
    from spark_jobs import TableSource

    source = TableSource(
        table="shop.orders",
        key="id",
        schema={"id": "int64", "amount": "decimal(12,2)", "placed_at": "timestamp"},
    )
    ```

    Args:
        table: `"schema.table"`, or `"table"` in schema `public`.
        key: An integer column (checked against the catalog when a run opens); splits are
            ranges of it.
        schema: Columns to read → types (checked against the catalog when a run opens).
        required: As for `FileSource`.
        event_time: As for `FileSource`; optional: declare it when the rows have one.
        rows_per_split: Target number of rows per split.
        out_of_orderness: As for `FileSource`.
        idle_timeout: As for `FileSource`.
        late_records: As for `FileSource`.
    """

    table: str
    key: str
    schema: Mapping[str, TypeSpec] = field(default_factory=dict)
    required: Sequence[str] = ()
    event_time: str | None = None
    rows_per_split: int = 100_000
    out_of_orderness: Duration = "5s"
    idle_timeout: Duration = "60s"
    late_records: LatePolicy = "reopen"

    @property
    def partition_by(self) -> None:
        return None
