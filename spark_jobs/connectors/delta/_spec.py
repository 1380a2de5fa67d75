"""The spec of the Delta Lake sink: what a user writes in a pipeline definition."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from os import PathLike

__all__ = ["DeltaSink"]


@dataclass(frozen=True)
class DeltaSink:
    """A Delta Lake table (written with delta-rs), committed exactly once per checkpoint.

    The table is created on first use from the pipeline's output schema; for a
    day-partitioned source it gets a `date` partition column (`partition_by`) holding the
    record's output day, in Hive-style `dt=YYYY-MM-DD/` folders. Each completed checkpoint
    becomes one Delta commit that carries the app transaction `sluice-<pipeline>-<run id>`
    with the checkpoint id as its version, so a recovery never commits a checkpoint twice.
    Rebuilding a day (`sluice run --date D --replace`, a Dagster re-materialisation) replaces
    that day's files in one commit. A pipeline that adds an output field adds the column.

    ```python
    from spark_jobs import DeltaSink

    sink = DeltaSink("s3://lake/analytics/events_enriched")
    ```

    Args:
        path: The table folder: an absolute local folder, a folder relative to
            `SLUICE_WAREHOUSE_DIR` (no `..`), `file://…`, or `s3://bucket/prefix/table`
            (endpoint and region from `SLUICE_S3_*`, credentials from the standard chain).
        partition_by: The name of the table's partition column for a day-partitioned
            pipeline (type `date`; must not be an output field). `None`: an unpartitioned
            table even for a day-partitioned pipeline (rebuilds then are not possible).
        upsert_key: Output fields identifying a row: each checkpoint is merged into the
            table (`MERGE`: a row replaces the row with its key unless that row's event
            time is later — the latest event of a key wins, then the last one processed)
            instead of appended. `None`: rows are appended.
        compression: The Parquet codec of the data files (`"zstd"`, `"snappy"`, …).
    """

    path: str | PathLike[str]
    partition_by: str | None = "dt"
    upsert_key: Sequence[str] | None = None
    compression: str = "zstd"
