"""The snapshot chunk reader of a CDC source: a ``pgcdc-chunk`` key range of one table.

Offset rule as for the table source (``TableRangeSplit``): a record's offset is its key, a
block covers ``[the key its query started from, last key + 1)``. Each page (``batch_rows``
keys, keyset paging) is read in its own short ``REPEATABLE READ`` transaction, without a
lock: any snapshot taken after the slot's start is right (the stream replays every change
since; see ``_enumerator``). Rows are emitted as op ``r`` with ``_lsn`` = the slot's start
(``start_lsn`` of the source's enumerator cursor, read once per source) and ``_commit_time``
= the page's transaction time. The WAL position before and after each page is logged at
debug level (the chunk's low and high marks, for observability).

Threading: ``open`` and ``fetch`` block on Postgres and run on one fetcher thread;
``wake_up`` has nothing to interrupt (a ``fetch`` runs one query).
"""

from __future__ import annotations

import logging
from typing import Any

import psycopg

from enumerator_service import TableRangeSplit
from spark_jobs.pipeline._errors import quote
from spark_jobs.source._batch import ParsedBlock, RecordSchema
from spark_jobs.source._convert import RecordConverter
from spark_jobs.source._records import SplitRead
from spark_jobs.source._table_reader import Page, page_block

__all__ = ["ChunkReader"]

_log = logging.getLogger(__name__)

_START = "SELECT cursor ->> 'start_lsn' FROM sluice.enumerator_state WHERE source = %s"
_MARKS = "SELECT pg_current_wal_lsn() - '0/0', now()"


class ChunkReader:
    """Reads one read of a snapshot chunk at a time, one page (one block) per ``fetch``."""

    def __init__(
        self, schema: RecordSchema, dsn: str, *, declared: tuple[str, ...], batch_rows: int = 5000
    ) -> None:
        self._schema = schema
        self._converter = RecordConverter(schema)
        self._names = list(self._converter.names)
        self._declared = declared
        self._dsn = dsn
        self._batch = batch_rows
        self._read: SplitRead | None = None
        self._query = ""
        self._table = ""
        self._next_key = 0
        self._stop = 0
        self._start_lsn: dict[str, int] = {}
        self._conn: psycopg.Connection[tuple[Any, ...]] | None = None

    def open(self, read: SplitRead) -> None:
        split = read.split
        if not isinstance(split, TableRangeSplit):
            raise TypeError(f"not a chunk split: {split!r}")
        schema, _, table = split.table.rpartition(".")
        key = quote(split.key_column)
        columns = ", ".join([key, *(quote(n) for n in self._declared)])
        self._query = (
            f"SELECT {columns} FROM {quote(schema)}.{quote(table)}"
            f" WHERE {key} >= %s AND {key} < %s ORDER BY {key} LIMIT %s"
        )
        self._table = split.table
        self._read = read
        self._next_key = read.resume
        self._stop = split.high if read.stop is None else min(read.stop, split.high)

    def _connection(self) -> psycopg.Connection[tuple[Any, ...]]:
        if self._conn is None:
            self._conn = psycopg.connect(self._dsn, application_name="sluice-cdc-snapshot")
            self._conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
        return self._conn

    def _slot_start(self, source: str) -> int:
        found = self._start_lsn.get(source)
        if found is None:
            with psycopg.connect(self._dsn, autocommit=True) as conn:
                row = conn.execute(_START, (source,)).fetchone()
            if row is None or row[0] is None:
                raise RuntimeError(f"{source}: no slot start recorded (discover first)")
            found = self._start_lsn[source] = int(row[0])
        return found

    def fetch(self) -> tuple[ParsedBlock | None, bool]:
        read = self._read
        if read is None or self._next_key >= self._stop:
            self._read = None
            return None, True
        start_lsn = self._slot_start(read.split.source)
        conn = self._connection()
        with conn.transaction():
            low, read_at = conn.execute(_MARKS).fetchone()  # type: ignore[misc]
            found = conn.execute(self._query, (self._next_key, self._stop, self._batch)).fetchall()
            high, _ = conn.execute(_MARKS).fetchone()  # type: ignore[misc]
        _log.debug(
            "chunk %s [%d, %d): page read between LSN %s and %s",
            self._table, self._next_key, self._stop, low, high,
        )  # fmt: skip
        finished = len(found) < self._batch
        if finished:
            self._read = None
        if not found:
            return None, finished
        tail = ("r", start_lsn, read_at, None, self._table)
        page = Page(self._converter, self._schema, list(self._declared))
        block = page_block(page, read.split_id, self._next_key, found, tail)
        self._next_key = block.end
        return block, finished

    def wake_up(self) -> None:
        """Nothing to interrupt: a ``fetch`` runs one query."""

    def close(self) -> None:
        self._read = None
        if self._conn is not None:
            self._conn.close()
            self._conn = None
