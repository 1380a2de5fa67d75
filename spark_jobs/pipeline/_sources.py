"""Where a pipeline's records come from: landing files, or a Postgres table's key ranges.

Both are plain, immutable descriptions. Nothing is checked when one is built: the
:class:`~spark_jobs.pipeline.Pipeline` that holds it validates everything at once and names
itself, the part and the field in its error.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import date
from os import PathLike
from typing import Literal

from spark_jobs.pipeline._types import Duration, TypeSpec

__all__ = ["LATE_POLICIES", "FileSource", "LatePolicy", "Source", "TableSource"]

#: ``late_records``: dead-letter a late record (reason ``late``), or reopen its partition.
LatePolicy = Literal["dead_letter", "reopen"]
LATE_POLICIES: tuple[LatePolicy, ...] = ("dead_letter", "reopen")


@dataclass(frozen=True)
class FileSource:
    """Files landing in a folder; the format of each comes from its name.

    - ``schema``: field name → type (``"string"``, ``"int64"``, ``"decimal(12,2)"``,
      ``"timestamp"``, …). Only these fields are read; other fields of a record are ignored.
    - ``required``: fields that must be present and not null; a record without one is a dead
      letter (``missing field: …``). Other fields are null when absent.
    - ``event_time``: a ``timestamp`` field: per-split watermarks (bounded out-of-orderness
      ``out_of_orderness``, idle after ``idle_timeout``); the task watermark flows through
      every step to the sink. Without it the pipeline has no watermarks.
    - ``late_records``: what happens to a record whose event time is behind a completed
      output partition's end: ``"dead_letter"`` (reason ``late``) or ``"reopen"`` (written
      to the partition, which is reported again; needs ``event_time`` and
      ``partition_by="day"``).
    - ``partition_by``: ``"day"`` — files live in ``<landing>/dt=YYYY-MM-DD/`` folders named
      after their records' event day; the day is the output partition (``dt=`` folders or a
      ``dt`` column) and the Dagster partition. ``None``: files directly in ``<landing>``,
      output and asset unpartitioned.
    - ``landing``: the folder; a relative path is under ``SLUICE_DATA_DIR``; default
      ``<SLUICE_DATA_DIR>/landing/<pipeline name>``. Or a URI: ``file://…``,
      ``s3://bucket/prefix`` (endpoint and region: ``SLUICE_S3_ENDPOINT_URL``,
      ``SLUICE_S3_REGION``; credentials from the standard AWS chain), and through the same
      code the other ``pyarrow.fs`` stores ``gs://``, ``abfs://``, ``hdfs://``.
    - ``start_date``: first Dagster partition (default: the earliest ``dt=`` folder found when
      the code location loads, else today).
    - ``late_records``: what happens to a record whose event day is an output partition
      already recorded complete: ``"dead_letter"`` (a dead letter with reason ``late``) or
      ``"reopen"`` (the default: written to its partition, which completes again as a new
      generation — what a file landing late for a finished day did before completeness
      existed, so nothing is diverted silently).

    Formats by extension: ``.jsonl``/``.json`` (JSON Lines), ``.csv`` (with a header line),
    either gzip-compressed (``.jsonl.gz``, ``.csv.gz``), and ``.parquet``.
    """

    schema: Mapping[str, TypeSpec]
    required: Sequence[str] = ()
    event_time: str | None = None
    partition_by: Literal["day"] | None = "day"
    landing: str | PathLike[str] | None = None
    start_date: date | str | None = None
    out_of_orderness: Duration = "5s"
    idle_timeout: Duration = "60s"
    late_records: LatePolicy = "reopen"

    kind = "files"


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

    kind = "table"

    @property
    def partition_by(self) -> None:
        return None


Source = FileSource | TableSource
