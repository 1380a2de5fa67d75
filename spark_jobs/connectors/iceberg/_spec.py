"""The spec of the Iceberg sink: what a user writes in a pipeline definition."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["AUTO", "IcebergSink"]

#: ``IcebergSink.partition_by`` default: derived from the pipeline's partitions.
AUTO = "auto"


@dataclass(frozen=True)
class IcebergSink:
    """An Apache Iceberg table, one snapshot per completed checkpoint.

    The table is created on first use from the pipeline's output schema, in Sluice's own
    catalog (a PyIceberg `SqlCatalog` in the platform database, data under
    `<SLUICE_WAREHOUSE_DIR>/iceberg`) or in any PyIceberg catalog configured the standard
    way (`PYICEBERG_CATALOG__<NAME>__…` variables or `.pyiceberg.yaml`). A day-partitioned
    pipeline gets the partition spec `day(<event_time>)`; a pipeline without partitions an
    unpartitioned table. A field the pipeline adds is added to the table.

    Data files are staged per checkpoint under the table's data folder and added in one
    snapshot when the checkpoint completes (its summary names the run and the checkpoint,
    so a publish repeated after a crash adds nothing). Rebuilding a day (`sluice run
    --date D --replace`, a Dagster re-materialisation) replaces the day in one
    `overwrite` snapshot.

    ```python
    from spark_jobs import IcebergSink

    sink = IcebergSink("analytics.events_enriched")
    ```

    Args:
        table: `"namespace.name"` (lower-case identifiers); the namespace is created when
            missing.
        catalog: A PyIceberg catalog name (`load_catalog(name)`). Default: Sluice's catalog
            in the platform database.
        partition_by: `"auto"`: `day(<event_time>)` for a day-partitioned pipeline,
            unpartitioned otherwise. The event-time field's name says the same explicitly;
            `None` asks for an unpartitioned table (only for a pipeline without partitions).
        upsert_key: Output fields: each checkpoint's rows (one per key) replace the
            table's rows with their key, in one `overwrite` snapshot (the data files
            holding a key are rewritten without it: copy-on-write), unless a stored row's
            event time is later — the latest event of a key wins, then the last one
            processed. `None`: rows are appended.
        compression: The Parquet codec of the data files: `"zstd"`, `"snappy"`, `"gzip"`,
            `"lz4"`, `"brotli"` or `"none"`.
    """

    table: str
    catalog: str | None = None
    partition_by: str | None = AUTO
    upsert_key: Sequence[str] | None = None
    compression: str = "zstd"
