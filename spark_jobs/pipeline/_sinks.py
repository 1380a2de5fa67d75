"""Where a pipeline's output goes; both sinks are exactly-once (two-phase commit with the
checkpoint that covers the records)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from os import PathLike

__all__ = ["ParquetSink", "PostgresSink", "Sink"]


@dataclass(frozen=True)
class ParquetSink:
    """Parquet files under ``<SLUICE_WAREHOUSE_DIR>/<table>`` (default: the pipeline's
    name), in ``dt=YYYY-MM-DD`` folders for a day-partitioned source. Files become visible
    when their checkpoint completes; re-materialising a day replaces its folder in one swap.
    ``dictionary``: columns to dictionary-encode (worth it only where values repeat).

    ``path``: this sink's table folder instead of ``<warehouse>/<table>``: an absolute local
    folder, a folder relative to the warehouse root (no ``..``), ``file://…``, or an object
    store URI (``s3://bucket/prefix/table``; ``gs://``, ``abfs://``, ``hdfs://`` through the
    same code). Uncommitted files are staged next to it, in ``<parent>/_staging/<name>``
    (the same file system or bucket, never inside the table folder)."""

    table: str | None = None
    dictionary: Sequence[str] = ()
    compression: str = "zstd"
    path: str | PathLike[str] | None = None

    kind = "parquet"


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

    kind = "postgres"


Sink = ParquetSink | PostgresSink
