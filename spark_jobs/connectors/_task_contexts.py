"""What a connector's task-side reader and writer get inside a Spark task.

``ReaderContext`` goes to a source connector's split reader (``SourceConnector.split_reader``,
``concurrent_reader``), ``SinkWriterContext`` to a sink connector's writer
(``SinkConnector.open_writer``). Both are built by the driver, shipped in the task's closure
and must never carry a secret: the database URL travels without its password, object-store
settings without credentials.

Threading: immutable values, shared freely.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from enumerator_service import StorageOptions

__all__ = ["ReaderContext", "SinkWriterContext"]


@dataclass(frozen=True, slots=True)
class ReaderContext:
    """What a split reader may use inside a Spark task (no secret travels in it: ``dsn`` is
    the database URL without its password, which the task completes from its environment)."""

    max_line_bytes: int
    block_bytes: int
    dsn: str
    #: What the connector's ``reader_root`` gave the driver (files: the landing folder), or None.
    root: Any = None
    #: ``SLUICE_FOLLOW_SYMLINKS``.
    follow_symlinks: bool = False
    #: The source connector's validated options (``SourceDetails.options`` of the plan).
    options: Any = None
    #: How object stores are reached in the task (endpoint, region; never credentials).
    storage: StorageOptions = field(default_factory=StorageOptions)
    #: The run is continuous (an unbounded split is followed, not read up to "now").
    continuous: bool = False


@dataclass(frozen=True, slots=True)
class SinkWriterContext:
    """What a sink writer gets inside a task."""

    schema: pa.Schema
    partitioned: bool
    dsn: str
    run_id: str
    subtask: int
    attempt: str
    #: Where staged files go and where the table folder is (file sinks), else unused.
    staging_root: Any = None
    output_root: Any = None
