"""Reads splits of every kind by handing each to the split reader of its format.

A subtask reads one split at a time, so the router only ever has one active format reader;
the next split goes to its reader once the current one is finished. Plain JSON Lines splits
are read in parsed blocks (:class:`JsonBlockSplitReader`, parsed on the fetcher thread); every
other format hands over one record at a time, parsed on the mailbox thread by ``parse``.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any, Protocol, TypeAlias

from enumerator_service import SplitAssignment
from spark_jobs.source._blocks import EventBlock
from spark_jobs.source._csv_reader import CsvSplitReader, LinesSplitReader, parse_csv_record
from spark_jobs.source._events import Event, parse_event
from spark_jobs.source._jsonl_blocks import JsonBlockSplitReader
from spark_jobs.source._parquet_reader import (
    ParquetSplitReader,
    RowRecord,
    RowsWithSplitIds,
    parse_parquet_record,
)
from spark_jobs.source._records import RawLine, RecordsWithSplitIds
from spark_jobs.source._table_reader import TableRangeSplitReader

__all__ = ["FormatRouter", "SplitBatch", "SplitReader"]

SplitBatch: TypeAlias = (
    RecordsWithSplitIds[RawLine] | RowsWithSplitIds | RecordsWithSplitIds[EventBlock]
)
Record = RawLine | RowRecord | EventBlock


class SplitReader(Protocol):
    """The blocking side of a source (FLIP-27's SplitReader).

    ``fetch`` may block and is called by one fetcher thread; ``wake_up`` may be called from any
    thread and makes a blocked ``fetch`` return early.
    """

    def add_split(self, assignment: SplitAssignment) -> None: ...
    def has_splits(self) -> bool: ...
    def fetch(self) -> SplitBatch: ...
    def wake_up(self) -> None: ...
    def close(self) -> None: ...


class FormatRouter:
    """A SplitReader over JSON Lines, CSV (plain or gzip), Parquet and Postgres table ranges.

    ``parse`` (mailbox thread) turns a record of a split into an Event, a dead-letter reason,
    or None (not a record), with the parser of that split's format.
    """

    def __init__(self, *, max_line_bytes: int, dsn: str, block_bytes: int = 256 << 10) -> None:
        self._max_line = max_line_bytes
        self._blocks = JsonBlockSplitReader(max_line_bytes=max_line_bytes, chunk_bytes=block_bytes)
        self._lines = LinesSplitReader(max_line_bytes=max_line_bytes)
        self._csv = CsvSplitReader(max_line_bytes=max_line_bytes)
        self._parquet = ParquetSplitReader()
        self._table = TableRangeSplitReader(dsn)
        self._pending: deque[SplitAssignment] = deque()
        self._active: SplitReader | None = None
        # Written by the fetcher thread before the split's first batch is handed over.
        self._parsers: dict[int, Callable[[int, Any], Event | str | None]] = {}

    @property
    def max_line_bytes(self) -> int:
        return self._max_line

    def _reader_for(self, kind: str) -> SplitReader:
        if kind == "jsonl":
            return self._blocks
        if kind == "jsonl.gz":
            return self._lines
        if kind in ("csv", "csv.gz"):
            return self._csv
        if kind == "parquet":
            return self._parquet
        if kind == "table":
            return self._table
        raise ValueError(f"no split reader for kind {kind!r}")

    def _parser_for(self, kind: str) -> Callable[[int, Any], Event | str | None]:
        if kind in ("jsonl", "jsonl.gz"):
            return lambda split_id, line: parse_event(split_id, line, self._max_line)
        if kind in ("csv", "csv.gz"):
            return lambda split_id, line: parse_csv_record(
                split_id, self._csv.header_of(split_id), line, self._max_line
            )
        return parse_parquet_record  # Parquet and table rows are both RowRecords

    def add_split(self, assignment: SplitAssignment) -> None:
        kind = assignment.split.kind
        self._reader_for(kind)  # unknown kinds fail here, in the fetcher, not later
        self._parsers[assignment.split_id] = self._parser_for(kind)
        self._pending.append(assignment)

    def has_splits(self) -> bool:
        return bool(self._pending) or (self._active is not None and self._active.has_splits())

    def fetch(self) -> SplitBatch:
        if self._active is None or not self._active.has_splits():
            if not self._pending:
                self._active = None
                return RecordsWithSplitIds[RawLine]()
            assignment = self._pending.popleft()
            self._active = self._reader_for(assignment.split.kind)
            self._active.add_split(assignment)
        return self._active.fetch()

    def parse(self, split_id: int, record: Record) -> Event | str | None:
        return self._parsers[split_id](split_id, record)

    def split_done(self, split_id: int) -> None:
        """Forget a finished split's parser (and its CSV header)."""
        self._parsers.pop(split_id, None)
        self._csv.release(split_id)

    def wake_up(self) -> None:
        if self._active is not None:
            self._active.wake_up()

    def close(self) -> None:
        for reader in (self._blocks, self._lines, self._csv, self._parquet, self._table):
            reader.close()
