"""A reader subtask's configuration: what Spark ships to the workers for one run.

It travels pickled in every task's closure, so it holds no password: the database is a
:class:`~spark_jobs.jobs._credentials.WorkerDatabase` (the URL without its password, and where
the executor reads it).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pyarrow as pa

from enumerator_service._storage import StorageOptions
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
    output_root: str
    staging_root: str
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
    #: A file source's landing folder (resolved) and whether symbolic links may lead out of
    #: it (``SLUICE_FOLLOW_SYMLINKS``), or its URI on an object store (``s3://…``); None:
    #: files are opened without that check.
    landing_root: str | None = None
    follow_symlinks: bool = False
    #: How executors reach an object store (endpoint, region: never credentials, which
    #: each executor takes from its own standard chain).
    storage: StorageOptions = field(default_factory=StorageOptions)

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
