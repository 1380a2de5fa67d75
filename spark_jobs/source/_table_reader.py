"""Blocking reader of Postgres table key-range splits (runs in a fetcher thread)."""

from __future__ import annotations

from collections import deque
from typing import Any

import psycopg
from psycopg.rows import dict_row

from enumerator_service import SplitAssignment, TableRangeSplit, validate_identifier
from spark_jobs.source._parquet_reader import RowRecord, RowsWithSplitIds

__all__ = ["TableRangeSplitReader"]


class TableRangeSplitReader:
    """Reads the rows of its splits in key order, ``batch_rows`` per query (keyset paging).

    Offset rule (see TableRangeSplit): a record's ``offset`` is its key and ``next_offset`` is
    key + 1, so the state offset after emitting a row is the smallest key not yet emitted.

    Threading: ``fetch`` blocks on Postgres and is called by one fetcher thread only;
    ``wake_up`` may be called from any thread (a query in progress finishes first).
    """

    def __init__(self, dsn: str, *, batch_rows: int = 2000) -> None:
        if batch_rows < 1:
            raise ValueError("batch_rows must be positive")
        self._dsn = dsn
        self._batch = batch_rows
        self._splits: deque[SplitAssignment] = deque()
        self._current: SplitAssignment | None = None
        self._next_key = 0
        self._conn: psycopg.Connection[dict[str, Any]] | None = None
        self._woken = False

    def add_split(self, assignment: SplitAssignment) -> None:
        if not isinstance(assignment.split, TableRangeSplit):
            raise TypeError(f"not a table range split: {assignment.split!r}")
        self._splits.append(assignment)

    def has_splits(self) -> bool:
        return self._current is not None or bool(self._splits)

    def wake_up(self) -> None:
        self._woken = True

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def _query(self, split: TableRangeSplit) -> str:
        schema, _, table = split.table.partition(".")
        for name, setting in ((schema, "schema"), (table, "table"), (split.key_column, "key")):
            validate_identifier(name, setting)
        key = split.key_column
        return (
            f"SELECT * FROM {schema}.{table} WHERE {key} >= %s AND {key} < %s "
            f"ORDER BY {key} LIMIT %s"
        )

    def fetch(self) -> RowsWithSplitIds:
        self._woken = False
        batch = RowsWithSplitIds()
        if self._current is None:
            if not self._splits:
                return batch
            self._current = self._splits.popleft()
            self._next_key = self._current.resume_offset
        assignment = self._current
        split = assignment.split
        assert isinstance(split, TableRangeSplit)
        if self._conn is None:
            self._conn = psycopg.connect(self._dsn, row_factory=dict_row, autocommit=True)
        rows = self._conn.execute(
            self._query(split), (self._next_key, split.high, self._batch), prepare=True
        ).fetchall()
        key = split.key_column
        records = [RowRecord(row[key], row[key] + 1, row) for row in rows]
        if records:
            batch.records[assignment.split_id] = records
            self._next_key = records[-1].next_offset
        if len(rows) < self._batch:
            batch.finished.append(assignment.split_id)
            self._current = None
        return batch
