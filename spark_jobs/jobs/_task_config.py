"""A reader subtask's configuration: what Spark ships to the workers for one run.

It travels pickled in every task's closure, so it holds no password: the database is a
:class:`~spark_jobs.jobs._credentials.WorkerDatabase` (the URL without its password, and where
the executor reads it).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from enumerator_service import Location, StorageOptions, open_location
from spark_jobs.connectors import SinkConnector, SourceConnector, ensure_registered
from spark_jobs.jobs._credentials import WorkerDatabase
from spark_jobs.pipeline import Pipeline
from spark_jobs.pipeline._plan import Plan

__all__ = ["StepDefaults", "TaskConfig"]


@dataclass(frozen=True, slots=True)
class StepDefaults:
    """Platform defaults (``SLUICE_LOOKUP_*``) for the options a step leaves unset."""

    lookup_capacity: int = 8
    lookup_batch_size: int = 4096
    lookup_pool_size: int = 4
    lookup_timeout_seconds: float = 30.0
    lookup_retries: int = 3
    #: Benchmarks only: slept per lookup round trip while holding the connection.
    injected_latency_ms: float = 0.0


@dataclass(frozen=True, slots=True)
class TaskConfig:
    """Everything a subtask needs. The pipeline travels with its resolved plan (looked-up
    column types from the catalog); its user functions are pickled with it."""

    pipeline: Pipeline
    plan: Plan
    #: Step index → looked-up table column → Arrow type.
    lookup_types: dict[int, dict[str, pa.DataType]]
    #: The platform database, without its password (read on the executor: ``database_url``).
    database: WorkerDatabase
    run_id: str
    lease_seconds: float
    #: The Parquet table and staging folders: local paths or object-store URIs.
    output_root: str | None
    staging_root: str | None
    max_line_bytes: int
    #: Line files are read and parsed in blocks of about this many bytes (operator elements).
    block_bytes: int = 256 << 10
    #: Most splits per request to the split store, and their byte budget (SLUICE_PULL_MAX_*).
    pull_max_splits: int = 1
    pull_max_bytes: int = 0
    defaults: StepDefaults = field(default_factory=StepDefaults)
    exactly_once: bool = True
    checkpoint_poll_seconds: float = 1.0
    #: A continuous subtask keeps asking for splits; it ends after ``continuous_idle_seconds``
    #: without one (None: only when cancelled).
    continuous: bool = False
    continuous_poll_seconds: float = 1.0
    continuous_idle_seconds: float | None = None
    #: Failed attempts on a split's content before it is quarantined (SLUICE_SPLIT_MAX_ATTEMPTS).
    split_max_attempts: int = 3
    debug: bool = False
    #: What the source connector's ``reader_root`` gives its split readers (files: the
    #: resolved landing folder) and whether symbolic links may lead out of a landing folder
    #: (``SLUICE_FOLLOW_SYMLINKS``); None: no root.
    source_root: Any = None
    follow_symlinks: bool = False
    #: Object-store client settings (endpoint, region; never credentials: an executor takes
    #: those from its own standard chain).
    storage: StorageOptions = field(default_factory=StorageOptions)
    #: The run's connectors, pickled with the task (see :meth:`register_connectors`).
    source_connector: SourceConnector | None = None
    sink_connector: SinkConnector | None = None
    #: The run's number of subtasks (owners of stream partitions: ``pull_splits(owners=)``).
    parallelism: int = 1

    def register_connectors(self) -> None:
        """Register the run's connectors in this process when they are not (a connector
        defined in a pipeline module shipped to the workers by value: its module's
        ``register_source`` never runs there)."""
        if self.source_connector is not None:
            ensure_registered(type(self.pipeline.source), self.source_connector)
        if self.sink_connector is not None:
            ensure_registered(type(self.pipeline.sink), self.sink_connector)

    def folder(self, uri: str | None) -> Location | None:
        """A file sink's folder (``output_root``, ``staging_root``) opened in the task with
        its own credential chain (None: a sink of rows has none)."""
        return None if uri is None else open_location(uri, self.storage)

    @property
    def database_url(self) -> str:
        """The database URL with its password, resolved on the executor that asks."""
        return self.database.resolve()

    @property
    def asyncpg_dsn(self) -> str:
        """:attr:`database_url` in the form asyncpg accepts."""
        return self.database.asyncpg_dsn()

    @property
    def source(self) -> str:
        """The split source: the pipeline's name."""
        return self.pipeline.name
