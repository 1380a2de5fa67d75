"""Reader of Postgres table key-range splits in blocks (runs in a fetcher thread).

Offset rule (see TableRangeSplit): a record's offset is its key, so the state offset after a
block is the smallest key not yet emitted (the block's last key + 1). A read covers the keys
``[resume, stop)`` (``stop``: the split's ``high``, or a replayed range's end), in key order,
``batch_rows`` per query (keyset paging): ``SELECT key, declared columns`` with every
identifier quoted. Each row is converted by the exact per-row path
(:meth:`RecordConverter.from_values`: psycopg's Python values — str, int, Decimal, float,
bool, datetime, date, bytes); a bad row's dead letter holds the row as JSON. A block covers
``[key the query started from, last key + 1)``, so consecutive blocks of a read touch.

Threading: ``open`` and ``fetch`` block on Postgres and are called by one fetcher thread
only; ``wake_up`` may be called from any thread (a query in progress finishes first).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import psycopg

from enumerator_service import TableRangeSplit
from spark_jobs.pipeline._errors import quote
from spark_jobs.source._batch import DeadLetter, ParsedBlock, RecordSchema
from spark_jobs.source._convert import RecordConverter, new_block, raw_json
from spark_jobs.source._records import SplitRead

__all__ = ["Page", "TableRangeSplitReader", "page_block", "table_query"]


@dataclass(frozen=True, slots=True)
class Page:
    """How a key-range reader turns a page of rows into records: its converter, the schema of
    its blocks and the declared field names (of dead letters)."""

    converter: RecordConverter
    schema: RecordSchema
    names: list[str]


def page_block(
    reader: Page, split_id: int, start: int, found: list[Any], tail: tuple[Any, ...] = ()
) -> ParsedBlock:
    """The block of one page of ``(key, *values)`` rows read from ``start``, ending after its
    last key (``tail``: values appended to every row). A row the converter refuses is a dead letter
    with its declared values."""
    rows: list[tuple[Any, ...]] = []
    offsets: list[int] = []
    dead: list[DeadLetter] = []
    for key, *values in found:
        parsed = reader.converter.from_values([*values, *tail])
        if isinstance(parsed, str):
            dead.append((key, raw_json(dict(zip(reader.names, values, strict=True))), parsed))
        else:
            rows.append(parsed)
            offsets.append(key)
    batch = reader.converter.to_batch(rows, offsets)
    return new_block(reader.schema, split_id, start, found[-1][0] + 1, batch, dead)


def table_query(split: TableRangeSplit, names: list[str]) -> str:
    """The keyset-paging query of a split's table (parameters: low key, high key, limit)."""
    schema, _, table = split.table.rpartition(".")
    source = f"{quote(schema)}.{quote(table)}" if schema else quote(table)
    key = quote(split.key_column)
    selected = ", ".join([key, *(quote(name) for name in names)])
    return (
        f"SELECT {selected} FROM {source} WHERE {key} >= %s AND {key} < %s ORDER BY {key} LIMIT %s"
    )


class TableRangeSplitReader:
    """Reads one read of a table range at a time, one query (one block) per ``fetch``."""

    def __init__(self, schema: RecordSchema, dsn: str, *, batch_rows: int = 2000) -> None:
        if batch_rows < 1:
            raise ValueError("batch_rows must be positive")
        self._schema = schema
        self._converter = RecordConverter(schema)
        self._names = list(self._converter.names)
        self._dsn = dsn
        self._batch = batch_rows
        self._read: SplitRead | None = None
        self._query = ""
        self._next_key = 0
        self._stop = 0
        self._conn: psycopg.Connection[tuple[Any, ...]] | None = None

    def open(self, read: SplitRead) -> None:
        split = read.split
        if not isinstance(split, TableRangeSplit):
            raise TypeError(f"not a table range split: {split!r}")
        self._read = read
        self._query = table_query(split, self._names)
        self._next_key = read.resume
        self._stop = split.high if read.stop is None else min(read.stop, split.high)

    def fetch(self) -> tuple[ParsedBlock | None, bool]:
        read = self._read
        if read is None or self._next_key >= self._stop:
            self._read = None
            return None, True
        if self._conn is None:
            self._conn = psycopg.connect(self._dsn, autocommit=True)
        found = self._conn.execute(
            self._query, (self._next_key, self._stop, self._batch), prepare=True
        ).fetchall()
        finished = len(found) < self._batch
        if finished:
            self._read = None
        if not found:
            return None, finished
        block = page_block(Page(self._converter, self._schema, self._names), read.split_id,
                           self._next_key, found)  # fmt: skip
        self._next_key = block.end
        return block, finished

    def wake_up(self) -> None:
        """Nothing to interrupt: a ``fetch`` runs one query."""

    def close(self) -> None:
        self._read = None
        if self._conn is not None:
            self._conn.close()
            self._conn = None
