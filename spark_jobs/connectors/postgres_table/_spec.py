"""The spec of the Postgres table source: what a user writes in a pipeline definition."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from spark_jobs.pipeline._sources import LatePolicy
from spark_jobs.pipeline._types import Duration, TypeSpec

__all__ = ["TableSource"]


@dataclass(frozen=True)
class TableSource:
    """Rows of a Postgres table, read in ranges of its integer ``key`` column (FLIP-27 splits
    of about ``rows_per_split`` rows). The first discovery covers the keys present; later
    ones register ranges of keys appended above the highest one seen (append-only tables are
    read continuously; rows inserted below it later are not seen).

    ``schema`` names the columns to read and their types (checked against the catalog when a
    run opens); ``required``, ``event_time`` (optional: declare it when the rows have one,
    else the pipeline has no watermarks), the watermark strategy and ``late_records`` as for
    :class:`FileSource`. The output is unpartitioned.
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
