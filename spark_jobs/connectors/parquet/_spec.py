"""The spec of the Parquet sink: what a user writes in a pipeline definition."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["ParquetSink"]


@dataclass(frozen=True)
class ParquetSink:
    """Parquet files under ``<SLUICE_WAREHOUSE_DIR>/<table>`` (default: the pipeline's
    name), in ``dt=YYYY-MM-DD`` folders for a day-partitioned source. Files become visible
    when their checkpoint completes; re-materialising a day replaces its folder in one swap.
    ``dictionary``: columns to dictionary-encode (worth it only where values repeat)."""

    table: str | None = None
    dictionary: Sequence[str] = ()
    compression: str = "zstd"
