"""The connector contracts: what a source and a sink give the platform.

Modelled on Flink's ``Source`` (``SplitEnumerator`` + split serializer + ``SourceReader``) and
``Sink`` (``SinkWriter`` + ``Committer``), with their contracts and not their verbosity:

- a **source connector** turns its *spec* (the user's immutable definition value) into the
  source part of a plan (``SourceConnector.validate``), builds the *enumerator* that
  discovers its splits (bounded for given days, or one continuous tick, with bounded state;
  ``SourceConnector.discovery``) and the *split reader* a Spark task reads them with
  (``SourceConnector.split_reader``; ``fetch`` may block in the fetcher thread and must
  return early on ``wake_up()``). Splits are stored in Postgres as rows of the split store
  (``kind``, ``uri``, byte or key range, state): that row is the split's codec.
- a **sink connector** turns its spec into the sink part of a plan, opens the *writer* that
  stages output inside a task per checkpoint (snapshot and restore travel with the task's
  checkpoint state) and provides the *committer* (a
  ``TransactionalSink``: commit inside the checkpoint's Postgres
  transaction, publish after it, idempotent on recovery; abort) and, when it can, the
  replacement of one output partition for rebuilds.

Every concrete connector lives in its own folder under ``spark_jobs/connectors/`` and is
registered there (``spark_jobs.connectors._registry``); the driver, the reader task, the
CLI and the Dagster factory ask the registry and never name a concrete connector.

Threading: connector objects are stateless and shared; their methods run on the caller's
thread (the driver, a CLI command, a sensor tick). Split readers and writers are owned by one
Spark task (see their own docstrings).

The contracts live in modules by role — ``_source_contract`` (``SourceConnector`` and what
its validation decides), ``_sink_contract`` (``SinkConnector``), ``_task_contexts`` (what a
task-side reader or writer gets) and ``_hooks`` (``CompletionHook``) — and are re-exported
here, where connectors import them from.
"""

from __future__ import annotations

from spark_jobs.connectors._hooks import CompletionHook
from spark_jobs.connectors._sink_contract import SinkConnector, SinkDetails
from spark_jobs.connectors._source_contract import (
    ObservedInput,
    SourceConnector,
    SourceDetails,
    TableInput,
    UpstreamAsset,
)
from spark_jobs.connectors._task_contexts import ReaderContext, SinkWriterContext

__all__ = [
    "CompletionHook",
    "ObservedInput",
    "ReaderContext",
    "SinkConnector",
    "SinkDetails",
    "SinkWriterContext",
    "SourceConnector",
    "SourceDetails",
    "TableInput",
    "UpstreamAsset",
]
