"""Commit side of the Postgres table sink: staged batches move into their target table inside
the transaction that completes their checkpoint.

``commit`` reads each entry's batch table (``_batch_tables``; the checks: every table is
there and holds the rows its pre-commit recorded), writes the rows into the target and drops
the batch tables, on the connection of the completion transaction, so the rows become
visible atomically with the split states and roll back with them. An upsert sink takes per
key the row of the latest event time (``latest_by``), then the last staged (highest batch,
then sequence), so rows of one commit never conflict with each other, and replaces a stored
row unless that one's event time is later (a rebuild of an older day, a late record: the
latest event stays, whatever the order of processing): one ``MERGE`` on Postgres 15 and
later (``_table_merge``), else ``INSERT … ON CONFLICT … DO UPDATE``. A change stream's upsert
(``op_field``, e.g. a CDC source's ``_op``) also deletes: a key whose winning row is a delete
loses its stored row, unless that one is of a later ``latest_by`` (``_lsn``). An entry
without a batch table was staged by a version before them, into one shared
``<table>__staged``: it is moved from there (``DELETE … RETURNING``). ``publish`` has nothing
left to do; ``abort`` drops batch tables.

Every staged entry names its table, columns, partitioning, upsert key and batch table; they
are validated again (``TableLayout.from_entry``, ``checked_batch_table``) before any of them
reaches SQL.

AT_LEAST_ONCE: the reader task passes this sink to ``acknowledge``, which runs ``commit`` in
the subtask's acknowledgement transaction — the rows become visible together with that
subtask's split states (no alignment across subtasks; rows of a split whose state was fenced
may be duplicated by a replay, or rewritten, for an upsert sink).
"""

from __future__ import annotations

import json
import logging
from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

from psycopg import sql
from sqlalchemy.engine import Connection, Engine

from enumerator_service import StagedTransaction
from spark_jobs.sink._batch_tables import checked_batch_table, drop_batch_tables
from spark_jobs.sink._table_layout import (
    BORN_COLUMN,
    ENTRY_KEY,
    KEY_COLUMNS,
    SEQ_COLUMN,
    TABLE_SINK_NAME,
    TableLayout,
    column_list,
    execute,
    existing_staging,
    missing_tables,
    same_key,
    set_from,
    stored_not_later,
    winners,
)
from spark_jobs.sink._table_merge import merge_rows, merge_supported

__all__ = ["PostgresTableSink"]

_log = logging.getLogger(__name__)

_KEYS = sql.SQL(
    "SELECT * FROM jsonb_to_recordset(CAST(%(keys)s AS jsonb))"
    " AS k(run_id text, subtask integer, attempt text, batch bigint)"
)
_MATCH = sql.SQL(" AND ").join(
    sql.SQL("s.{} = k.{}").format(sql.Identifier(column), sql.Identifier(field))
    for (column, _), field in zip(KEY_COLUMNS, ENTRY_KEY, strict=True)
)
_BATCH = KEY_COLUMNS[3][0]
#: The completion's ``work_mem`` at least (per sort), for an upsert's ``DISTINCT ON``: a 1 s
#: checkpoint of a change stream stages ~60,000 rows (~9 MB to sort), which Postgres's
#: default 4 MB sorts through temporary files (measured: ~5 % more of the commit's CPU).
#: Raised for the transaction only (``set_config(..., true)``), never lowered.
_SORT_MEMORY = sql.SQL(
    "SELECT set_config('work_mem', '64MB', true)"
    " WHERE pg_size_bytes(current_setting('work_mem')) < pg_size_bytes('64MB')"
)


def _keys(entries: Sequence[Mapping[str, Any]]) -> str:
    return json.dumps([{n: e[n] for n in ENTRY_KEY} for e in entries])


def _entries(txns: Sequence[StagedTransaction]) -> list[Mapping[str, Any]]:
    return [entry for txn in txns for entry in txn.staged]


def _upsert(layout: TableLayout) -> sql.Composed:
    """The upsert of the moved rows: one per key (the latest by ``latest_by``, then the last
    staged), replacing a target row unless that one is of a later ``latest_by``."""
    assert layout.upsert_key is not None
    columns = set_from(layout, "EXCLUDED")
    keep_later: sql.Composable = sql.SQL("")
    if layout.latest_by is not None:
        keep_later = sql.SQL(" WHERE {}").format(stored_not_later(layout, "EXCLUDED"))
    update = (
        sql.SQL("DO NOTHING")
        if columns is None
        else sql.SQL("DO UPDATE SET {}{}").format(columns, keep_later)
    )
    return sql.SQL(
        "INSERT INTO {target} AS stored ({columns}) {winners} ON CONFLICT ({key}) {update}"
    ).format(
        target=layout.target,
        columns=column_list(layout.names),
        winners=winners(layout),
        key=column_list(layout.upsert_key),
        update=update,
    )


def _upsert_and_delete(layout: TableLayout) -> sql.Composed:
    """A change stream's upsert (``op_field``): per key, the winner of the moved rows (the
    greatest ``latest_by``, then the last staged); a winner whose operation is ``d`` deletes
    the stored row unless that one is of a later ``latest_by``, any other upserts as in
    :func:`_upsert`. One statement: each target row is touched at most once."""
    assert layout.upsert_key is not None and layout.latest_by is not None
    assert layout.op_field is not None
    columns = set_from(layout, "EXCLUDED")
    update = (
        sql.SQL("DO NOTHING")
        if columns is None
        else sql.SQL("DO UPDATE SET {} WHERE {}").format(
            columns, stored_not_later(layout, "EXCLUDED")
        )
    )
    return sql.SQL(
        "winners AS ({winners}),"
        " upserted AS (INSERT INTO {target} AS stored ({columns}) SELECT {columns} FROM winners"
        " WHERE {op} IS DISTINCT FROM 'd' ON CONFLICT ({key}) {update}),"
        " deleted AS (DELETE FROM {target} AS stored USING winners AS w WHERE w.{op} = 'd'"
        " AND {same_key} AND ({not_later}))"
    ).format(
        winners=winners(layout),
        key=column_list(layout.upsert_key),
        columns=column_list(layout.names),
        target=layout.target,
        op=sql.Identifier(layout.op_field),
        update=update,
        same_key=same_key(layout, "w"),
        not_later=stored_not_later(layout, "w"),
    )


def _legacy_rows(layout: TableLayout) -> sql.Composed:
    """The staged rows of the batches ``%(keys)s`` in the shared staging table (a batch staged
    before issue 25's batch tables), deleted as they are read."""
    if layout.staging is None:  # (such a sink never had one: see ``table_names``)
        raise RuntimeError(f"sink {layout.qualified} has no shared staging table to move from")
    return sql.SQL(
        "DELETE FROM {staging} AS s USING ({keys}) AS k WHERE {match} RETURNING {returned}"
    ).format(
        staging=layout.staging,
        keys=_KEYS,
        match=_MATCH,
        returned=column_list([_BATCH, SEQ_COLUMN, *layout.names], "s"),
    )


def _batch_rows(
    layout: TableLayout, entries: Sequence[Mapping[str, Any]], born: bool = False
) -> sql.Composed:
    """The rows of the entries' batch tables, each with its batch number (and, ``born``,
    then ``BORN_COLUMN``)."""
    extra = [BORN_COLUMN] if born else []
    return sql.SQL(" UNION ALL ").join(
        sql.SQL("SELECT CAST({number} AS bigint) AS {batch}, {columns} FROM {table}").format(
            number=sql.Literal(int(entry["batch"])),
            batch=sql.Identifier(_BATCH),
            columns=column_list([SEQ_COLUMN, *layout.names, *extra]),
            table=sql.Identifier(layout.schema, checked_batch_table(entry["staged_table"])),
        )
        for entry in entries
    )


def _move(layout: TableLayout, rows: sql.Composable) -> sql.Composed:
    """The statement writing the staged ``rows`` (batch, sequence, columns) into the target;
    returns how many it read."""
    if layout.op_field is not None:
        return sql.SQL("WITH moved AS ({rows}), {writes} SELECT count(*) FROM moved").format(
            rows=rows, writes=_upsert_and_delete(layout)
        )
    if layout.upsert_key is None:
        insert = sql.SQL("INSERT INTO {target} ({columns}) SELECT {columns} FROM moved").format(
            target=layout.target, columns=column_list(layout.names)
        )
    else:
        insert = _upsert(layout)
    return sql.SQL(
        "WITH moved AS ({rows}), written AS ({insert}) SELECT count(*) FROM moved"
    ).format(rows=rows, insert=insert)


def _commit_layout(
    conn: Connection, layout: TableLayout, entries: Sequence[Mapping[str, Any]]
) -> None:
    """Move the entries' rows of one layout; RuntimeError (the completion rolls back) when
    fewer are staged than their pre-commits recorded."""
    in_tables = [e for e in entries if "staged_table" in e]
    legacy = [e for e in entries if "staged_table" not in e]
    moved = expected = 0
    if legacy:
        query = _move(layout, _legacy_rows(layout))
        moved += conn.exec_driver_sql(query.as_string(), {"keys": _keys(legacy)}).scalar_one()
        expected += sum(int(e["rows"]) for e in legacy)
    if in_tables:
        names = [checked_batch_table(e["staged_table"]) for e in in_tables]
        missing = missing_tables(conn, layout.schema, names)
        if missing:
            raise RuntimeError(
                f"staged output is lost: {len(missing)} staged batch table(s) of"
                f" {layout.qualified} are missing ({', '.join(missing[:3])})"
            )
        # Batch tables that say whether their rows' keys were created in them (every one
        # staged since that column: the commit may insert those rows without a lookup).
        born = all(e.get("born") is True for e in in_tables)
        rows = _batch_rows(layout, in_tables, born)
        if layout.upsert_key is not None:
            execute(conn, _SORT_MEMORY)
        merged = (
            layout.upsert_key is not None
            and merge_supported(conn)
            and merge_rows(conn, layout, rows, born=born)
        )
        query = (
            sql.SQL("SELECT count(*) FROM ({}) AS r").format(rows)
            if merged
            else _move(layout, rows)
        )
        moved += conn.exec_driver_sql(query.as_string()).scalar_one()
        expected += sum(int(e["rows"]) for e in in_tables)
        drop = drop_batch_tables(layout.schema, names)
        assert drop is not None
        execute(conn, drop)
    if moved != expected:
        raise RuntimeError(
            f"staged output is lost: {expected} rows were staged for"
            f" {layout.qualified}, {moved} are left"
        )


class PostgresTableSink:
    """Commit side of the table sink (coordinator, recovery, AT_LEAST_ONCE acknowledgements).

    Threading: no state but the optional engine; safe on any thread. ``commit`` works on the
    caller's connection. ``abort`` needs ``engine``: without one (the module-level registry
    that has no database) it leaves the rows, which are invisible and later removed by
    ``sweep_staged``.
    """

    name = TABLE_SINK_NAME

    def __init__(self, engine: Engine | None = None) -> None:
        self._engine = engine

    def commit(self, conn: Connection, txns: Sequence[StagedTransaction]) -> None:
        """Inside the completion transaction: move the staged rows into the target table.

        Runs once per transaction (the caller marks it committed in the same transaction);
        raises if fewer rows are staged than the pre-commit recorded, which rolls back the
        completion instead of committing a checkpoint without its output.
        """
        grouped: dict[TableLayout, list[Mapping[str, Any]]] = defaultdict(list)
        for entry in _entries(txns):
            grouped[TableLayout.from_entry(entry)].append(entry)
        for layout, entries in sorted(grouped.items(), key=lambda item: repr(item[0])):
            _commit_layout(conn, layout, entries)

    def publish(self, txns: Sequence[StagedTransaction]) -> None:
        return None  # the rows became visible when the completion transaction committed

    def abort(self, txns: Sequence[StagedTransaction]) -> None:
        """Delete staged rows that will never commit. Idempotent."""
        if self._engine is None:
            _log.debug("no engine: %d staged transaction(s) left to the sweep", len(txns))
            return
        grouped: dict[tuple[str, str], list[Mapping[str, Any]]] = defaultdict(list)
        for entry in _entries(txns):
            grouped[entry["schema"], entry["table"]].append(entry)
        with self._engine.begin() as conn:
            for (schema, table), entries in sorted(grouped.items()):
                drop = drop_batch_tables(
                    schema, [e["staged_table"] for e in entries if "staged_table" in e]
                )
                if drop is not None:
                    execute(conn, drop)
                legacy = [e for e in entries if "staged_table" not in e]
                staging = existing_staging(conn, schema, table) if legacy else None
                if staging is not None:
                    query = sql.SQL("DELETE FROM {} AS s USING ({}) AS k WHERE {}").format(
                        staging, _KEYS, _MATCH
                    )
                    execute(conn, query, keys=_keys(legacy))
