"""The subtask's source side: the split fetcher, its record emitter and the reader over them.

Built on the mailbox thread before the loop starts; the fetcher's thread starts with
:meth:`SourceReaderBase.start`. A retried attempt first restores the splits its predecessor
held (``SplitStore.reclaim``: a new fencing epoch), then pulls more as it runs out — several
small splits per transaction (``SplitStore.pull_splits``, bounded by ``SLUICE_PULL_MAX_SPLITS``
and ``SLUICE_PULL_MAX_BYTES``), each under its own epoch and lease.
"""

from __future__ import annotations

import functools

import pyarrow as pa

from enumerator_service import SplitStore
from spark_jobs.jobs._task_config import TaskConfig
from spark_jobs.pipeline._plan import SourcePlan
from spark_jobs.source import (
    FormatRouter,
    HandoffQueue,
    RecordEmitter,
    SourceReaderBase,
    SplitFetcher,
)
from spark_jobs.source._batch import RecordSchema
from spark_jobs.source._format_router import SplitReader

__all__ = ["open_source_reader", "record_schema"]

#: Parsed blocks waiting for the mailbox thread: the fetcher blocks (wakeably) beyond this.
_HANDOFF_CAPACITY = 4


def record_schema(source: SourcePlan) -> RecordSchema:
    """What the pipeline's source emits."""
    return RecordSchema(
        tuple(pa.field(c.name, c.type) for c in source.columns),
        source.required,
        source.event_time,
    )


def open_source_reader(config: TaskConfig, subtask: int, store: SplitStore) -> SourceReaderBase:
    """The reader of ``subtask`` (not started): the splits a dead attempt of it held first."""
    source = config.plan.source
    handoff = HandoffQueue(capacity=_HANDOFF_CAPACITY)
    restored = store.reclaim(config.run_id, subtask, config.lease_seconds)
    router = FormatRouter(
        record_schema(source),
        max_line_bytes=config.max_line_bytes,
        dsn=config.asyncpg_dsn,
        block_bytes=config.block_bytes,
        root=config.source_root,
        follow_symlinks=config.follow_symlinks,
        options=source.options,
        storage=config.storage,
        continuous=config.continuous,
    )
    connector = config.source_connector
    concurrent = connector is not None and connector.concurrent_splits
    reader: SplitReader = router
    owned: tuple[str, ...] = ()
    if concurrent:
        # A stream source: all the subtask's partitions at once, each pulled only by its
        # owner (one reader per partition for the whole run).
        assert connector is not None
        reader = connector.concurrent_reader(router.schema, router.context)
        owned = connector.split_kinds
    fetcher = SplitFetcher(
        reader,
        handoff,
        functools.partial(
            store.pull_splits,
            config.run_id,
            subtask,
            config.lease_seconds,
            max_splits=config.pull_max_splits,
            max_bytes=config.pull_max_bytes,
            owned_kinds=owned,
            owners=config.parallelism,
        ),
        restored,
        name=f"split-fetcher-{subtask}",
        poll_interval=config.continuous_poll_seconds if config.continuous else None,
        idle_exit=config.continuous_idle_seconds,
        concurrent=concurrent,
    )
    emitter = RecordEmitter(
        out_of_orderness=source.out_of_orderness, idle_timeout=source.idle_timeout
    )
    return SourceReaderBase(fetcher, handoff, emitter)
