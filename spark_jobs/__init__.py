"""Sluice reading: everything that runs inside a Spark task, the pipeline API, the CLI.

Public pipeline definition names are re-exported here (``from spark_jobs import Pipeline``).
Sub-packages: ``pipeline`` (definitions, validation), ``runtime`` (mailbox), ``async_io``
(async wait operator and queues), ``source`` (split readers, fetcher, emitter, source
reader), ``lookup`` (Postgres lookups), ``sink`` (transactional Parquet and Postgres),
``checkpoint`` (barriers, coordinator), ``jobs`` (driver and subtask), ``cli``.
"""

from spark_jobs._outcomes import BadInputFailure, DeterministicFailure, ExitCode
from spark_jobs._spark import spark_for
from spark_jobs.pipeline import (
    EMPTY_RESULT,
    HAS_EXCEPTION,
    AsyncFunction,
    AsyncMap,
    CoroutineAsyncFunction,
    DeltaSink,
    DemoDataRefused,
    FileSource,
    Filter,
    FullCache,
    IcebergSink,
    KafkaSource,
    Lookup,
    Map,
    ParquetSink,
    PartialCache,
    Pipeline,
    PipelineDefinitionError,
    PostgresCdcSource,
    PostgresSink,
    ResultFuture,
    RetryOnMiss,
    SampleTarget,
    TableSource,
    claim_demo_table,
    exponential_backoff,
    fixed_delay,
)

__all__ = [
    "EMPTY_RESULT",
    "HAS_EXCEPTION",
    "AsyncFunction",
    "AsyncMap",
    "BadInputFailure",
    "CoroutineAsyncFunction",
    "DeltaSink",
    "DemoDataRefused",
    "DeterministicFailure",
    "ExitCode",
    "FileSource",
    "Filter",
    "FullCache",
    "IcebergSink",
    "KafkaSource",
    "Lookup",
    "Map",
    "ParquetSink",
    "PartialCache",
    "Pipeline",
    "PipelineDefinitionError",
    "PostgresCdcSource",
    "PostgresSink",
    "ResultFuture",
    "RetryOnMiss",
    "SampleTarget",
    "TableSource",
    "claim_demo_table",
    "exponential_backoff",
    "fixed_delay",
    "spark_for",
]
