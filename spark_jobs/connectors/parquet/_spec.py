"""The spec of the Parquet sink: what a user writes in a pipeline definition."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from os import PathLike

__all__ = ["ParquetSink"]


@dataclass(frozen=True)
class ParquetSink:
    """Parquet files under `<SLUICE_WAREHOUSE_DIR>/<table>`, in `dt=YYYY-MM-DD` folders for
    a day-partitioned source.

    Files become visible when their checkpoint completes; rebuilding a day (`sluice run
    --date D --replace`, a Dagster re-materialisation) replaces its folder in one swap.
    Uncommitted files are staged next to the table folder, in `<parent>/_staging/<name>`
    (the same file system or bucket, never inside the table folder).

    ```python
    from spark_jobs import ParquetSink

    sink = ParquetSink(table="events_enriched", dictionary=["country"])
    ```

    Args:
        table: The table folder's name under the warehouse. Default: the pipeline's name.
        dictionary: Columns to dictionary-encode (worth it only where values repeat).
        compression: `"zstd"`, `"snappy"`, `"gzip"`, `"lz4"`, `"brotli"` or `"none"`.
        path: This sink's table folder instead of `<warehouse>/<table>`: an absolute local
            folder, a folder relative to the warehouse root (no `..`), `file://…`, or an
            object-store URI (`s3://bucket/prefix/table`; `gs://`, `abfs://`, `hdfs://`
            through the same code).
    """

    table: str | None = None
    dictionary: Sequence[str] = ()
    compression: str = "zstd"
    path: str | PathLike[str] | None = None
