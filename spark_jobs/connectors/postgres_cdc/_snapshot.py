"""The snapshot chunk reader of a CDC source: a ``pgcdc-chunk`` key range of one table.

Offset rule as for the table source (``TableRangeSplit``): a record's offset is its key, a
block covers ``[the key its query started from, last key + 1)``. Each page (``batch_rows``
keys, keyset paging) is read in its own short ``REPEATABLE READ`` transaction, without a
lock: any snapshot taken after the slot's start is right (the stream replays every change
since; see ``_enumerator``). Rows are emitted as op ``r`` with ``_lsn`` = the slot's start
(``start_lsn`` of the source's enumerator cursor, read once per source) and ``_commit_time``
= the page's transaction time. The WAL position before and after each page is logged at
debug level (the chunk's low and high marks, for observability).

Values are exactly the stream's: a column is read in Postgres's text form — its type's
output function, the one the walsender calls (``format('%s', col)``; a ``::text`` cast is
not always that: ``char(n)`` loses its padding, ``inet`` gains a netmask) — and converted by
the stream's text converter (:func:`from_text`, by the column's type OID from
``pg_attribute``, the OID pgoutput's Relation message carries). So json, jsonb, arrays,
uuid, interval, enums, domains… give the same text as a streamed change (psycopg's own
decoding gives dicts, lists, UUIDs, and jsonb ``null`` as NULL). Only the types whose
psycopg value is provably that same value (integers, floats, bool, text, varchar, char) are
read natively, for speed; so are date and timestamp[tz] columns (psycopg parses them in C to
the same date, the same naive time or the same instant — a sink stores it in UTC) — except
that a value Python cannot hold (``infinity``, BC) is psycopg's ``DataError``, where the
stream fails with its own line: such a page is read again all in text form, which fails the
run with exactly the stream's line.

Threading: ``open`` and ``fetch`` block on Postgres and run on one fetcher thread;
``wake_up`` has nothing to interrupt (a ``fetch`` runs one query).
"""

from __future__ import annotations

import logging
from collections import defaultdict
from typing import Any

import psycopg

from enumerator_service import TableRangeSplit, qualified_name
from spark_jobs.connectors.postgres_cdc._changes import CdcError
from spark_jobs.connectors.postgres_cdc._pgoutput import from_text
from spark_jobs.connectors.postgres_cdc._source_db import (
    PLATFORM,
    connect_patiently,
    session_options,
)
from spark_jobs.pipeline._errors import quote
from spark_jobs.source._batch import ParsedBlock, RecordSchema
from spark_jobs.source._convert import RecordConverter
from spark_jobs.source._records import SplitRead
from spark_jobs.source._table_reader import Page, page_block

__all__ = ["ChunkReader"]


def _as_text(column: str) -> str:
    """The column's text form by its type's output function (``format`` gives '' for NULL;
    ``%%``: the query has parameters)."""
    return f"CASE WHEN {column} IS NULL THEN NULL ELSE format('%%s', {column}) END"


def _qualified(table: str) -> str:
    """``schema.table`` quoted (as SQL text, and as the text ``to_regclass`` takes)."""
    schema, _, name = table.rpartition(".")
    return qualified_name(schema, name)


_log = logging.getLogger(__name__)

_START = "SELECT cursor ->> 'start_lsn' FROM sluice.enumerator_state WHERE source = %s"
_MARKS = "SELECT pg_current_wal_lsn() - '0/0', now()"
_TYPES = (
    "SELECT attname, atttypid::int FROM pg_catalog.pg_attribute"
    " WHERE attrelid = to_regclass(%s) AND attnum > 0 AND NOT attisdropped"
)
#: Types whose psycopg value equals ``from_text`` of their text (int2/4/8, oid, float4/8,
#: bool, text, varchar, bpchar): read natively. Any other column is read as text.
_NATIVE = frozenset({20, 21, 23, 26, 700, 701, 16, 25, 1043, 1042})
#: date, timestamp, timestamptz: the same value natively, but not the same failure.
_TEMPORAL = frozenset({1082, 1114, 1184})

#: A page query and (index in a fetched row, type OID, name) of each column it reads as text.
_Query = tuple[str, list[tuple[int, int, str]]]


class ChunkReader:
    """Reads one read of a snapshot chunk at a time, one page (one block) per ``fetch``."""

    def __init__(
        self,
        schema: RecordSchema,
        dsn: str,
        *,
        declared: tuple[str, ...],
        batch_rows: int = 5000,
        state_dsn: str | None = None,
        where: tuple[str, str] = PLATFORM,
    ) -> None:
        # ``dsn``: the tables' database; ``state_dsn``: the platform's (the slot start
        # discovery recorded), default the same.
        self._schema = schema
        self._converter = RecordConverter(schema)
        self._names = list(self._converter.names)
        self._declared = declared
        self._dsn = dsn
        self._state_dsn = dsn if state_dsn is None else state_dsn
        self._where = where  # what a connection error to ``dsn`` names
        self._batch = batch_rows
        self._read: SplitRead | None = None
        self._table = ""
        #: The page query with temporal columns read natively, and the one all in text form.
        self._fast: _Query = ("", [])
        self._exact: _Query = ("", [])
        self._next_key = 0
        self._stop = 0
        self._start_lsn: dict[str, int] = {}
        self._conn: psycopg.Connection[tuple[Any, ...]] | None = None

    def open(self, read: SplitRead) -> None:
        split = read.split
        if not isinstance(split, TableRangeSplit):
            raise TypeError(f"not a chunk split: {split!r}")
        types = self._column_types(split.table)
        self._fast = self._page_query(split, types, _NATIVE | _TEMPORAL)
        self._exact = self._page_query(split, types, _NATIVE)
        self._table = split.table
        self._read = read
        self._next_key = read.resume
        self._stop = split.high if read.stop is None else min(read.stop, split.high)

    def _page_query(
        self, split: TableRangeSplit, types: dict[str, int], native: frozenset[int]
    ) -> _Query:
        key = quote(split.key_column)
        texts = [
            (i + 1, types[n], n) for i, n in enumerate(self._declared) if types[n] not in native
        ]
        text = {n for _, _, n in texts}
        selected = [_as_text(quote(n)) if n in text else quote(n) for n in self._declared]
        query = (
            f"SELECT {', '.join([key, *selected])} FROM {_qualified(split.table)}"
            f" WHERE {key} >= %s AND {key} < %s ORDER BY {key} LIMIT %s"
        )
        return query, texts

    def _connection(self) -> psycopg.Connection[tuple[Any, ...]]:
        if self._conn is None:
            self._conn = connect_patiently(
                lambda: psycopg.connect(
                    self._dsn,
                    application_name="sluice-cdc-snapshot",
                    options=session_options(self._dsn),
                ),
                self._dsn,
                self._where,
            )
            self._conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
        return self._conn

    def _column_types(self, table: str) -> dict[str, int]:
        """Each column's type OID (a declared column the table lacks: the run's check and
        the stream say so; here it reads as text and its query fails)."""
        conn = self._connection()
        with conn.transaction():
            found = conn.execute(_TYPES, (_qualified(table),)).fetchall()
        return defaultdict(int, {str(name): int(oid) for name, oid in found})

    def _as_stream(
        self, rows: list[tuple[Any, ...]], texts: list[tuple[int, int, str]]
    ) -> list[Any]:
        """The rows with each text-read value converted as the stream converts it (a value
        it refuses fails the run with the stream's message)."""
        if not texts:
            return rows
        out = []
        for row in rows:
            values = list(row)
            for i, oid, name in texts:
                text = values[i]
                if text is not None:
                    try:
                        values[i] = from_text(oid, text)
                    except ValueError as exc:
                        raise CdcError(
                            f"table {self._table}: column {name!r}: {exc}; the snapshot reads"
                            " it again from the table: change the value there, then run again"
                        ) from None
            out.append(values)
        return out

    def _slot_start(self, source: str) -> int:
        found = self._start_lsn.get(source)
        if found is None:
            state = self._state_dsn
            with connect_patiently(lambda: psycopg.connect(state, autocommit=True), state) as conn:
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
        try:
            low, read_at, found, high = self._page(self._fast)
        except psycopg.DataError:
            # A date or timestamp psycopg cannot hold: the text form fails as the stream does.
            low, read_at, found, high = self._page(self._exact)
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

    def _page(self, query: _Query) -> tuple[Any, Any, list[Any], Any]:
        """(WAL position before, transaction time, rows, WAL position after) of the page
        from ``_next_key``, in one transaction."""
        conn = self._connection()
        with conn.transaction():
            low, read_at = conn.execute(_MARKS).fetchone()  # type: ignore[misc]
            found = conn.execute(query[0], (self._next_key, self._stop, self._batch)).fetchall()
            high, _ = conn.execute(_MARKS).fetchone()  # type: ignore[misc]
        return low, read_at, self._as_stream(found, query[1]), high

    def wake_up(self) -> None:
        """Nothing to interrupt: a ``fetch`` runs one query."""

    def close(self) -> None:
        self._read = None
        if self._conn is not None:
            self._conn.close()
            self._conn = None
