"""Apache Iceberg: a table in Sluice's catalog or any PyIceberg catalog, one snapshot per
completed checkpoint — the ``IcebergSink``."""

from spark_jobs.connectors._registry import register_sink
from spark_jobs.connectors.iceberg._commit import SINK_NAME, IcebergCommitter
from spark_jobs.connectors.iceberg._connector import IcebergConnector, IcebergOptions
from spark_jobs.connectors.iceberg._maintenance import (
    COMPACTION_PROPERTY,
    IcebergMaintenance,
    compact_day,
    expire_snapshots,
    remove_orphans,
)
from spark_jobs.connectors.iceberg._spec import IcebergSink

__all__ = [
    "COMPACTION_PROPERTY",
    "SINK_NAME",
    "IcebergCommitter",
    "IcebergConnector",
    "IcebergMaintenance",
    "IcebergOptions",
    "IcebergSink",
    "compact_day",
    "expire_snapshots",
    "remove_orphans",
]

register_sink(IcebergSink, IcebergConnector())
