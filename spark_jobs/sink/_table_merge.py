"""An upsert sink's commit as one ``MERGE`` (Postgres 15 and later).

The rows of a commit's batch tables go into the target as one ``MERGE`` from their winners
(per key, the latest ``latest_by``, then the last staged — the same ``DISTINCT ON`` as the
``INSERT … ON CONFLICT`` statement of ``_table_commit``): a matched key is updated (or, for a
change stream's delete, deleted) unless the stored row is of a later ``latest_by``, a new key
is inserted. The result is the one ``INSERT … ON CONFLICT`` gives, at about three quarters of
its Postgres CPU for a change stream (an ``ON CONFLICT`` insert is speculative: an extra
index check and WAL record per row).

A change stream's batch tables also say, per row, whether its key was created in the row's
hand-over (``BORN_COLUMN``: the key's first change there was an insert, so the source had no
row of it before). Such a winner cannot match a stored row (the target mirrors the source
up to the hand-over), so :func:`merge_rows` first inserts those winners with a plain
``INSERT`` — no lookup of the key and no ``MERGE`` action, about a sixth less of the commit's
Postgres CPU when most changes create their key — and merges the others, in one statement.
Where the premise does not hold (a stored row of a born key: a snapshot row read after the
insert, a replay at least once, a writer outside the pipeline) the unique index of the key
refuses the insert: the statement rolls back to its savepoint and the plain ``MERGE`` runs
instead, so the result is always the ``MERGE``'s. After such a fallback the next
``_SKIP_AFTER_FALLBACK`` commits of that table in the process go straight to the ``MERGE``:
while a stream catches up with its snapshot, created keys are stored ones commit after
commit, and each would pay for the failed statement too.

``MERGE`` inserting a key another transaction inserted after this statement's snapshot
fails with a unique violation where ``ON CONFLICT`` would have waited and updated: only a
writer outside the pipeline's checkpoints can do that (another pipeline upserting into the
same table). :func:`merge_rows` runs the ``MERGE`` under a savepoint and, on a unique
violation, rolls back to it and runs the ``ON CONFLICT`` statement instead.

Threading: the caller's connection (the completion transaction).
"""

from __future__ import annotations

import logging
import threading

import sqlalchemy as sa
from psycopg import errors, sql
from sqlalchemy.engine import Connection

from spark_jobs.sink._table_layout import (
    BORN_COLUMN,
    TableLayout,
    column_list,
    same_key,
    set_from,
    stored_not_later,
    winners,
)

__all__ = ["merge_rows", "merge_supported"]

_log = logging.getLogger(__name__)

#: Commits of a table that skip the insert of created keys after it failed (see above).
_SKIP_AFTER_FALLBACK = 16
#: Per target (``schema.table``): commits left to skip; any thread commits (one lock).
_skips: dict[str, int] = {}
_skips_lock = threading.Lock()


def _try_born(table: str) -> bool:
    """Whether this commit of ``table`` tries the insert of created keys (counts a skip)."""
    with _skips_lock:
        left = _skips.pop(table, 0)
        if left > 1:
            _skips[table] = left - 1
        return left == 0


def merge_supported(conn: Connection) -> bool:
    version = conn.dialect.server_version_info
    return version is not None and version >= (15,)


def _merge(layout: TableLayout, rows: sql.Composable, born: bool = False) -> sql.Composed:
    """The ``MERGE`` of ``rows``' winners; ``born`` (a change stream's rows with
    ``BORN_COLUMN``): the winners of born keys that upsert are inserted first, by a plain
    ``INSERT`` in the statement's ``WITH``, and merged are only the others (the two sets
    have no key in common: one winner per key)."""
    later: sql.Composable = sql.SQL("")
    if layout.latest_by is not None:
        later = sql.SQL(" AND ({})").format(stored_not_later(layout, "w"))
    columns = set_from(layout, "w")
    update = sql.SQL("DO NOTHING") if columns is None else sql.SQL("UPDATE SET {}").format(columns)
    insert = sql.SQL("INSERT ({}) VALUES ({})").format(
        column_list(layout.names), column_list(layout.names, "w")
    )
    if layout.op_field is None:
        actions = sql.SQL(
            " WHEN MATCHED{later} THEN {update} WHEN NOT MATCHED THEN {insert}"
        ).format(later=later, update=update, insert=insert)
    else:
        upsert = sql.SQL("w.{} IS DISTINCT FROM 'd'").format(sql.Identifier(layout.op_field))
        actions = sql.SQL(
            " WHEN MATCHED AND w.{op} = 'd'{later} THEN DELETE"
            " WHEN MATCHED AND {upsert}{later} THEN {update}"
            " WHEN NOT MATCHED AND {upsert} THEN {insert}"
        ).format(
            op=sql.Identifier(layout.op_field),
            later=later,
            upsert=upsert,
            update=update,
            insert=insert,
        )
    if not born:
        return sql.SQL(
            "WITH moved AS ({rows}), winners AS ({winners})"
            " MERGE INTO {target} AS stored USING winners AS w ON {same_key}{actions}"
        ).format(
            rows=rows,
            winners=winners(layout),
            target=layout.target,
            same_key=same_key(layout, "w"),
            actions=actions,
        )
    assert layout.op_field is not None
    new = sql.SQL("{born} AND {op} IS DISTINCT FROM 'd'").format(
        born=sql.Identifier(BORN_COLUMN), op=sql.Identifier(layout.op_field)
    )
    return sql.SQL(
        "WITH moved AS ({rows}), winners AS MATERIALIZED ({winners}),"
        " inserted AS (INSERT INTO {target} ({columns}) SELECT {columns} FROM winners"
        " WHERE {new})"
        " MERGE INTO {target} AS stored USING (SELECT {columns} FROM winners WHERE NOT ({new}))"
        " AS w ON {same_key}{actions}"
    ).format(
        rows=rows,
        winners=winners(layout, [BORN_COLUMN]),
        target=layout.target,
        columns=column_list(layout.names),
        new=new,
        same_key=same_key(layout, "w"),
        actions=actions,
    )


def merge_rows(
    conn: Connection, layout: TableLayout, rows: sql.Composable, *, born: bool = False
) -> bool:
    """Upsert ``rows`` (batch, sequence, columns, and ``BORN_COLUMN`` if ``born``) into
    ``layout``'s target with ``MERGE`` (inserting born keys' winners directly, if ``born``:
    see the module docstring); False (nothing written) when a concurrent insert of one of
    its keys made it fail: then upsert them with ``ON CONFLICT`` instead."""
    if born and _try_born(layout.qualified):
        try:
            with conn.begin_nested():
                conn.exec_driver_sql(_merge(layout, rows, born=True).as_string())
            return True
        except sa.exc.IntegrityError as exc:
            if not isinstance(exc.orig, errors.UniqueViolation):
                raise
            _log.info(
                "a key of a change stream's batch is stored in %s already (or was inserted"
                " meanwhile); merging every row instead",
                layout.qualified,
            )
            with _skips_lock:
                _skips[layout.qualified] = _SKIP_AFTER_FALLBACK
    try:
        with conn.begin_nested():
            conn.exec_driver_sql(_merge(layout, rows).as_string())
    except sa.exc.IntegrityError as exc:
        if not isinstance(exc.orig, errors.UniqueViolation):
            raise
        _log.info(
            "MERGE into %s met a key inserted meanwhile; upserting with ON CONFLICT instead",
            layout.qualified,
        )
        return False
    return True
