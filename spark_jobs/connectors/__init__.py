"""Connectors: the one way sources and sinks plug into Sluice.

A **source connector** (``SourceConnector``) turns its spec — the immutable value a
user puts in ``Pipeline(source=...)`` — into the source part of a plan, builds the enumerator
that discovers its splits and the split reader that reads them inside a Spark task. A **sink
connector** (``SinkConnector``) turns its spec into the sink part of a plan, opens the
writer that stages output per checkpoint inside a task and gives the committer that commits
it with the checkpoint (idempotent on recovery) and replaces one output partition for
rebuilds. Register one with ``register_source`` / ``register_sink``, keyed by its
spec type; nothing else in the platform names a concrete connector.

Built in, each in a folder of its own: ``files`` (``FileSource``), ``postgres_table``
(``TableSource``), ``kafka`` (``KafkaSource``), ``postgres_cdc`` (``PostgresCdcSource``),
``parquet`` (``ParquetSink``), ``postgres`` (``PostgresSink``), ``delta`` (``DeltaSink``),
``iceberg`` (``IcebergSink``).

A lakehouse sink also offers its table's maintenance (``SinkConnector.maintenance``: a
``TableMaintenance`` that compacts a day, expires snapshots, removes orphan files); the
Iceberg and Delta functions are public names of ``spark_jobs.connectors.iceberg`` and
``spark_jobs.connectors.delta``.
"""

from spark_jobs.connectors._interface import (
    CompletionHook,
    ObservedInput,
    ReaderContext,
    SinkConnector,
    SinkDetails,
    SinkWriterContext,
    SourceConnector,
    SourceDetails,
    TableInput,
    UpstreamAsset,
)
from spark_jobs.connectors._maintenance import (
    DEFAULT_GRACE,
    DEFAULT_RETENTION,
    CompactionResult,
    ExpiryResult,
    OrphanResult,
    TableMaintenance,
    pending_files,
    sweep_orphans,
)
from spark_jobs.connectors._registry import (
    ensure_registered,
    register_sink,
    register_source,
    registered_sinks,
    registered_sources,
    sink_connector,
    sink_connector_named,
    source_connector,
    source_connector_for_split,
    source_connector_named,
)
from spark_jobs.connectors.delta import DeltaSink
from spark_jobs.connectors.files import FileSource
from spark_jobs.connectors.iceberg import IcebergSink
from spark_jobs.connectors.kafka import KafkaSource
from spark_jobs.connectors.parquet import ParquetSink
from spark_jobs.connectors.postgres import PostgresSink
from spark_jobs.connectors.postgres_cdc import PostgresCdcSource
from spark_jobs.connectors.postgres_table import TableSource
from spark_jobs.pipeline._checks import Context as ValidationContext

__all__ = [
    "DEFAULT_GRACE",
    "DEFAULT_RETENTION",
    "CompactionResult",
    "CompletionHook",
    "DeltaSink",
    "ExpiryResult",
    "FileSource",
    "IcebergSink",
    "KafkaSource",
    "ObservedInput",
    "OrphanResult",
    "ParquetSink",
    "PostgresCdcSource",
    "PostgresSink",
    "ReaderContext",
    "SinkConnector",
    "SinkDetails",
    "SinkWriterContext",
    "SourceConnector",
    "SourceDetails",
    "TableInput",
    "TableMaintenance",
    "TableSource",
    "UpstreamAsset",
    "ValidationContext",
    "ensure_registered",
    "pending_files",
    "register_sink",
    "register_source",
    "registered_sinks",
    "registered_sources",
    "sink_connector",
    "sink_connector_named",
    "source_connector",
    "source_connector_for_split",
    "source_connector_named",
    "sweep_orphans",
]
