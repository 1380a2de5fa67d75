"""The SplitReader of a source: reads splits of every kind with the reader of their format.

Every format is read in :class:`ParsedBlock`\\ s of the source's :class:`RecordSchema`,
parsed and validated on the fetcher thread: line files (JSON Lines, CSV, plain or gzip) by
:class:`LineSplitReader`, Parquet by :class:`ParquetSplitReader`, Postgres table ranges by
:class:`TableRangeSplitReader`. A subtask reads one split at a time, so only one format
reader is active; the next read goes to its reader once the current one is finished.

Restore: a :class:`SplitAssignment` carries ``pending`` — ``{"span": [a, b]}`` entries, the
offset ranges that were in flight in the operator chain at the restored checkpoint. They are
read first, in order, as blocks marked ``replay`` (``replay_entry``: the entry's index in
``pending``; other keys of an entry are left to the task) holding exactly the records whose
offset lies in ``[a, b)`` (line files: a copy of the FileSplit with ``start=a, end=b``; gzip: lines
starting before ``b``; Parquet: rows; table: keys); then the split is read normally from its
resume offset. Only that final, normal read reports the split as finished.
"""

from __future__ import annotations

import dataclasses
from collections import deque
from collections.abc import Mapping
from typing import Protocol

from enumerator_service import FileSplit, LandingRoot, SplitAssignment
from enumerator_service._file_identity import check_unchanged, current
from enumerator_service._object_landing import ObjectLanding
from spark_jobs.source._batch import RecordSchema
from spark_jobs.source._line_reader import LINE_KINDS, LineSplitReader, check_whole_file
from spark_jobs.source._parquet_reader import ParquetSplitReader
from spark_jobs.source._poison import content_failure
from spark_jobs.source._records import BlockReader, RecordsWithSplitIds, SplitRead
from spark_jobs.source._table_reader import TableRangeSplitReader

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
        bounded = split
        if isinstance(split, FileSplit) and split.kind in ("jsonl", "csv"):
            bounded = dataclasses.replace(split, start=start, end=end)
        reads.append(SplitRead(assignment.split_id, bounded, start, end, True, index))
    return reads


class FormatRouter:
    """A SplitReader over JSON Lines, CSV (plain or gzip), Parquet and Postgres table ranges,
    producing blocks of ``schema``.

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
        landing: LandingRoot | ObjectLanding | None = None,
    ) -> None:
        self.schema = schema
        self._max_line = max_line_bytes
        # How a file's identity is taken now: a stat, or a HEAD on an object store.
        self._store = landing if isinstance(landing, ObjectLanding) else None
        self._identity_of = self._store.current if self._store is not None else current
        # Landing files are opened through ``landing`` (the run's folder): a link swapped in
        # after discovery that leads out of it is refused (None: no check).
        self._lines = LineSplitReader(
            schema, max_line_bytes=max_line_bytes, chunk_bytes=block_bytes, landing=landing
        )
        self._parquet = ParquetSplitReader(schema, landing=landing)
        self._table = TableRangeSplitReader(schema, dsn)
        self._reads: deque[SplitRead] = deque()
        self._current: tuple[SplitRead, BlockReader] | None = None

    @property
    def max_line_bytes(self) -> int:
        return self._max_line

    def _reader_for(self, kind: str) -> BlockReader:
        if kind in LINE_KINDS:
            return self._lines
        if kind == "parquet":
            return self._parquet
        if kind == "table":
            return self._table
        raise ValueError(f"no split reader for kind {kind!r}")

    def add_split(self, assignment: SplitAssignment) -> None:
        """Queue the split's replay reads, then its normal read. Unknown kinds, gzip ranges
        and unreadable pending entries fail here, in the fetcher, not later."""
        split = assignment.split
        self._reader_for(split.kind)
        if isinstance(split, FileSplit):
            check_whole_file(split)
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
            reader = self._reader_for(read.split.kind)
            self._current = (read, reader)
            try:
                if isinstance(read.split, FileSplit):
                    # Never a mix of two versions: the file must still be the one its split
                    # was cut from (size, mtime, inode at discovery), else the split is
                    # refused (quarantined at once, see ``_poison``).
                    check_unchanged(read.split.path, read.split.file, self._identity_of)
                reader.open(read)
            except Exception as exc:
                return self._failed(batch, exc)
        read, reader = self._current
        try:
            block, done = reader.fetch()
            if done and self._store is not None and isinstance(read.split, FileSplit):
                # On a store, once more when the read ends (one HEAD): an object overwritten
                # during the read fails its split before the last block is handed out (line
                # files also check after every request, see ``ObjectLanding.open``).
                check_unchanged(read.split.path, read.split.file, self._identity_of)
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
        read, reader = self._current
        self._current = None
        failure = content_failure(read.split_id, read.split.kind, exc)
        if failure is None:
            raise exc
        reader.close()
        self._reads = deque(r for r in self._reads if r.split_id != read.split_id)
        batch.failed.append(failure)
        return batch

    def wake_up(self) -> None:
        current = self._current
        if current is not None:
            current[1].wake_up()

    def close(self) -> None:
        self._current = None
        for reader in (self._lines, self._parquet, self._table):
            reader.close()
