"""Apache Iceberg: a table in Sluice's catalog or any PyIceberg catalog, one snapshot per
completed checkpoint — the ``IcebergSink``."""

from spark_jobs.connectors._registry import register_sink
from spark_jobs.connectors.iceberg._commit import SINK_NAME, IcebergCommitter
from spark_jobs.connectors.iceberg._connector import IcebergConnector, IcebergOptions
from spark_jobs.connectors.iceberg._spec import IcebergSink

__all__ = ["SINK_NAME", "IcebergCommitter", "IcebergConnector", "IcebergOptions", "IcebergSink"]

register_sink(IcebergSink, IcebergConnector())
