"""The spec of the Parquet sink: what a user writes in a pipeline definition."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from os import PathLike

__all__ = ["ParquetSink"]


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
