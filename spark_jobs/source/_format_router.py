"""The SplitReader of a source: reads splits of every kind with the reader of their
connector.

Every split is read in :class:`ParsedBlock`\\ s of the source's :class:`RecordSchema`,
parsed and validated on the fetcher thread, by the block reader its source connector gives
(:meth:`~spark_jobs.connectors.SourceConnector.split_reader`, made on first use; the
registry finds the connector by the split's kind). A subtask reads one split at a time, so
only one block reader is active; the next read goes to its reader once the current one is
finished.

Restore: a :class:`SplitAssignment` carries ``pending`` — ``{"span": [a, b]}`` entries, the
offset ranges that were in flight in the operator chain at the restored checkpoint. They are
read first, in order, as blocks marked ``replay`` (``replay_entry``: the entry's index in
``pending``; other keys of an entry are left to the task) holding exactly the records whose
offset lies in ``[a, b)`` (the split its connector's ``replay_split`` bounds — line files:
a copy of the split with ``start=a, end=b``; gzip: lines starting before ``b``; Parquet:
rows; table: keys); then the split is read normally from its resume offset. Only that final,
normal read reports the split as finished.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from typing import Any, Protocol

from enumerator_service import SplitAssignment, StorageOptions
from spark_jobs.connectors._interface import ReaderContext, SourceConnector
from spark_jobs.connectors._registry import source_connector_for_split
from spark_jobs.source._batch import RecordSchema
from spark_jobs.source._poison import content_failure
from spark_jobs.source._records import BlockReader, RecordsWithSplitIds, SplitRead

__all__ = ["FormatRouter", "SplitReader", "replay_reads"]


class SplitReader(Protocol):
    """The blocking side of a source (FLIP-27's SplitReader).

    ``fetch`` may block and is called by one fetcher thread; ``wake_up`` may be called from
    any thread and makes a blocked ``fetch`` return early.
    """

    def add_split(self, assignment: SplitAssignment) -> None: ...
    def has_splits(self) -> bool: ...
    def fetch(self) -> RecordsWithSplitIds: ...
    def wake_up(self) -> None: ...
    def close(self) -> None: ...


def replay_reads(assignment: SplitAssignment) -> list[SplitRead]:
    """The replay reads of an assignment's pending ranges, in order (empty ranges skipped).

    ValueError for an entry that is not ``{"span": [a, b]}`` (a restore must not drop it).
    """
    reads = []
    split = assignment.split
    for index, entry in enumerate(assignment.pending):
        span = entry.get("span") if isinstance(entry, Mapping) else None
        if not isinstance(span, list | tuple) or len(span) != 2:
            raise ValueError(f"split {assignment.split_id}: unreadable pending entry {entry!r}")
        start, end = int(span[0]), int(span[1])
        if start >= end:
            continue
        bounded = source_connector_for_split(split.kind).replay_split(split, start, end)
        reads.append(SplitRead(assignment.split_id, bounded, start, end, True, index))
    return reads


class FormatRouter:
    """A SplitReader over the splits of every registered source connector, producing blocks
    of ``schema``.

    Threading: ``add_split``, ``has_splits``, ``fetch`` and ``close`` are called by the one
    fetcher thread (``fetch`` and ``close`` may block on I/O); ``wake_up`` may be called from
    any thread and makes a running ``fetch`` return early (maybe without a block).
    """

    def __init__(
        self,
        schema: RecordSchema,
        *,
        max_line_bytes: int,
        dsn: str,
        block_bytes: int = 256 << 10,
        root: Any = None,
        follow_symlinks: bool = False,
        options: Any = None,
        storage: StorageOptions | None = None,
        continuous: bool = False,
    ) -> None:
        self.schema = schema
        # ``root``: what the source connector's ``reader_root`` gave (files: the landing
        # folder, opened files must be inside it; None: no check).
        self._context = ReaderContext(
            max_line_bytes,
            block_bytes,
            dsn,
            root,
            follow_symlinks,
            options,
            storage or StorageOptions(),
            continuous,
        )
        self._readers: dict[str, tuple[SourceConnector, BlockReader]] = {}
        self._reads: deque[SplitRead] = deque()
        self._current: tuple[SplitRead, SourceConnector, BlockReader] | None = None

    @property
    def max_line_bytes(self) -> int:
        return self._context.max_line_bytes

    @property
    def context(self) -> ReaderContext:
        """What the connectors' readers get in this task."""
        return self._context

    def _reader_for(self, kind: str) -> tuple[SourceConnector, BlockReader]:
        found = self._readers.get(kind)
        if found is None:
            try:
                connector = source_connector_for_split(kind)
            except KeyError:
                raise ValueError(f"no split reader for kind {kind!r}") from None
            for known, reader in self._readers.values():
                if known is connector:  # one reader per connector, whatever the kind
                    found = (connector, reader)
                    break
            else:
                found = (connector, connector.split_reader(self.schema, self._context))
            self._readers[kind] = found
        return found

    def add_split(self, assignment: SplitAssignment) -> None:
        """Queue the split's replay reads, then its normal read. Unknown kinds, splits their
        connector refuses (gzip ranges) and unreadable pending entries fail here, in the
        fetcher, not later."""
        split = assignment.split
        connector, _ = self._reader_for(split.kind)
        connector.check_split(split)
        self._reads.extend(replay_reads(assignment))
        self._reads.append(SplitRead.of(assignment))

    def has_splits(self) -> bool:
        return self._current is not None or bool(self._reads)

    def fetch(self) -> RecordsWithSplitIds:
        """At most one block of the current read; the split is finished with its last block
        (or in a fetch of its own) when its normal read ends. A read that raises on the
        split's content ends the split as failed (see ``_poison``)."""
        batch = RecordsWithSplitIds()
        if self._current is None:
            if not self._reads:
                return batch
            read = self._reads.popleft()
            connector, reader = self._reader_for(read.split.kind)
            self._current = (read, connector, reader)
            try:
                reader.open(read)
            except Exception as exc:
                return self._failed(batch, exc)
        read, _, reader = self._current
        try:
            block, done = reader.fetch()
        except Exception as exc:
            return self._failed(batch, exc)
        if block is not None:
            if read.replay:
                block.replay, block.replay_entry = True, read.entry
            batch.blocks.append(block)
        if done:
            self._current = None
            if not read.replay:
                batch.finished.append(read.split_id)
        return batch

    def _failed(self, batch: RecordsWithSplitIds, exc: Exception) -> RecordsWithSplitIds:
        """The current read raised: a content error drops its split (every read of it still
        queued too) and reports it in ``batch.failed``; anything else fails the fetcher."""
        assert self._current is not None
        read, connector, reader = self._current
        self._current = None
        failure = content_failure(read.split_id, connector.content_errors(), exc)
        if failure is None:
            raise exc
        reader.close()
        self._reads = deque(r for r in self._reads if r.split_id != read.split_id)
        batch.failed.append(failure)
        return batch

    def wake_up(self) -> None:
        current = self._current
        if current is not None:
            current[2].wake_up()

    def close(self) -> None:
        self._current = None
        for _, reader in {id(r): (c, r) for c, r in self._readers.values()}.values():
            reader.close()
