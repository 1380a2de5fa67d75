"""Setting up a Postgres sink table before a run, and removing what dead runs staged.

:func:`ensure_tables` creates the schema, the target table and its staging table when they
are missing and checks a target that exists: it must have every output column and no other
NOT NULL column without a default, and an upsert sink needs a unique index or constraint on
exactly its key (``ON CONFLICT`` infers it). The
staging table is the platform's own: one of another layout (the output changed) is rebuilt
once no live run has rows in it.

:func:`sweep_staged`: a batch pre-committed by an attempt that died before acknowledging has
no ``sink_transactions`` row; the driver deletes the staged rows of runs that hold no split
(after recovery, at the start and at the end of every run).

Threading: blocking database calls; the driver's thread.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import pyarrow as pa
import sqlalchemy as sa
from psycopg import sql
from sqlalchemy.engine import Connection, Engine

from enumerator_service import SCHEMA, ConfigError, splits
from spark_jobs.pipeline._types import postgres_type
from spark_jobs.sink._table_layout import (
    KEY_COLUMNS,
    PARTITION_COLUMN,
    SEQ_COLUMN,
    TableLayout,
    column_list,
    execute,
    staging_table,
    table_names,
)

__all__ = ["check_existing_target", "ensure_tables", "sweep_staged"]

_log = logging.getLogger(__name__)

#: ``postgres_type`` spellings that ``format_type`` (the catalog) spells differently.
_CATALOG_SPELLING = {
    "timestamptz": "timestamp with time zone",
    "timestamp": "timestamp without time zone",
}
_COLUMNS = sa.text(
    "SELECT a.attname, format_type(a.atttypid, a.atttypmod), a.attnotnull,"
    " a.attnotnull AND NOT a.atthasdef AND a.attidentity = '' AND a.attgenerated = ''"
    " FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid"
    " JOIN pg_namespace n ON n.oid = c.relnamespace"
    " WHERE n.nspname = :schema AND c.relname = :table AND a.attnum > 0"
    " AND NOT a.attisdropped"
)
#: Key columns of every unique, immediate, non-partial, expression-free index of the table:
#: the indexes ``ON CONFLICT (key)`` can use as its arbiter.
_UNIQUE_KEYS = sa.text(
    "SELECT array_agg(a.attname::text ORDER BY a.attname) FROM pg_index i"
    " JOIN pg_class c ON c.oid = i.indrelid JOIN pg_namespace n ON n.oid = c.relnamespace"
    " CROSS JOIN LATERAL generate_series(0, i.indnkeyatts - 1) AS p"
    " JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = i.indkey[p]"
    " WHERE n.nspname = :schema AND c.relname = :table AND i.indisunique"
    " AND i.indimmediate AND i.indpred IS NULL AND i.indexprs IS NULL"
    " GROUP BY i.indexrelid"
)


def _definition(name: str, kind: str, not_null: bool = False) -> sql.Composed:
    suffix = " NOT NULL" if not_null else ""
    return sql.SQL("{} {}{}").format(sql.Identifier(name), sql.SQL(kind), sql.SQL(suffix))


def _catalog(conn: Connection, schema: str, table: str) -> dict[str, tuple[str, bool, bool]]:
    """column → (format_type, NOT NULL, NOT NULL without a default) of an existing table;
    empty if there is none."""
    rows = conn.execute(_COLUMNS, {"schema": schema, "table": table}).all()
    return {str(row[0]): (str(row[1]), bool(row[2]), bool(row[3])) for row in rows}


def ensure_tables(
    engine: Engine,
    schema_name: str,
    table: str,
    columns: pa.Schema,
    *,
    partitioned: bool,
    upsert_key: Sequence[str] | None,
) -> None:
    """Create the target and staging tables of sink ``schema_name.table`` if missing.

    ``columns``: the pipeline's output schema (the target gets these columns, then ``dt
    date`` when ``partitioned``, and ``PRIMARY KEY (upsert_key)`` when upserting). A
    ConfigError (one line, setting ``sink <schema>.<table>``) when an existing target lacks
    an output column or has a NOT NULL column without a default that the output does not
    fill, when an upsert sink's target has no unique index or constraint on exactly the key
    columns, or when the staging table has another layout and a live run still has rows
    staged in it. Column types of an existing target are not checked (INSERT casts). Run by
    the driver at the start of a run.
    """
    setting = f"sink {schema_name}.{table}"
    try:
        layout = TableLayout.build(
            schema_name, table, columns.names, partitioned=partitioned, upsert_key=upsert_key
        )
        types = [(f.name, postgres_type(f.type), not f.nullable) for f in columns]
    except ValueError as exc:
        raise ConfigError(setting, str(exc)) from None
    if partitioned:
        types.append((PARTITION_COLUMN, "date", False))
    target = [_definition(name, kind, not_null) for name, kind, not_null in types]
    if layout.upsert_key is not None:
        target.append(sql.SQL("PRIMARY KEY ({})").format(column_list(layout.upsert_key)))
    # Staging: key and sequence NOT NULL, output columns nullable (the target checks).
    staged = [(name, kind, True) for name, kind in [*KEY_COLUMNS, (SEQ_COLUMN, "bigint")]]
    staged += [(name, kind, False) for name, kind, _ in types]
    with engine.begin() as conn:
        execute(conn, sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(schema_name)))
        execute(
            conn,
            sql.SQL("CREATE TABLE IF NOT EXISTS {} ({})").format(
                layout.target, sql.SQL(", ").join(target)
            ),
        )
        present = _catalog(conn, schema_name, table)
        missing = [name for name in layout.names if name not in present]
        if missing:
            kinds = {name: kind for name, kind, _ in types}
            added = ", ".join(f'ADD COLUMN "{name}" {kinds[name]}' for name in missing)
            raise ConfigError(
                setting,
                f"{layout.qualified} exists without column(s) {', '.join(missing)}; add them"
                f' (ALTER TABLE "{schema_name}"."{table}" {added}) or drop the table',
            )
        unfilled = [
            c for c, (*_, required) in present.items() if required and c not in layout.names
        ]
        if unfilled:
            raise ConfigError(
                setting,
                f"{layout.qualified} has NOT NULL column(s) without a default that the output"
                f" does not fill: {', '.join(unfilled)}",
            )
        _require_unique_key(conn, schema_name, table, layout.upsert_key)
        _ensure_staging(conn, layout, staged, setting)


def _require_unique_key(
    conn: Connection, schema_name: str, table: str, upsert_key: Sequence[str] | None
) -> None:
    """ConfigError unless the existing table has a unique index or constraint on exactly the
    upsert key (``ON CONFLICT (key)`` needs one as its arbiter)."""
    if upsert_key is None:
        return
    found = conn.execute(_UNIQUE_KEYS, {"schema": schema_name, "table": table})
    if frozenset(upsert_key) not in {frozenset(keys) for keys in found.scalars()}:
        raise ConfigError(
            f"sink {schema_name}.{table}",
            f"{schema_name}.{table} has no unique index or constraint on exactly"
            f" ({', '.join(upsert_key)}), which upsert_key needs",
        )


def check_existing_target(
    engine: Engine, schema_name: str, table: str, upsert_key: Sequence[str] | None
) -> None:
    """Read-only, before anything is created for the pipeline: an existing target without a
    unique index on the upsert key is the ConfigError ``ensure_tables`` would raise at the
    run's start. No table yet: nothing to say (the run creates it with its key)."""
    with engine.connect() as conn:
        if _catalog(conn, schema_name, table):
            _require_unique_key(conn, schema_name, table, upsert_key)


def _ensure_staging(
    conn: Connection, layout: TableLayout, staged: list[tuple[str, str, bool]], setting: str
) -> None:
    """Create the staging table, or rebuild one of another layout that holds no live rows.

    No index: the table only holds the batches of checkpoints not yet completed (a commit
    deletes what it moves, ``sweep_staged`` what dead runs left), so a commit's scan of it
    is short, while an index (the staging key was a primary key until issue 15) cost the
    COPY of every row half its Postgres time. The commit's row count (moved = staged)
    catches a batch staged twice. A staging table created with the key keeps it."""
    create = sql.SQL("CREATE TABLE IF NOT EXISTS {} ({})").format(
        layout.staging,
        sql.SQL(", ").join(_definition(*column) for column in staged),
    )
    execute(conn, create)
    name = staging_table(layout.table)
    present = _catalog(conn, layout.schema, name)
    wrong = [
        column
        for column, kind, not_null in staged
        if present.get(column, ("", False))[:2] != (_CATALOG_SPELLING.get(kind, kind), not_null)
    ]
    expected = {column for column, _, _ in staged}
    wrong += [c for c, (_, not_null, _) in present.items() if not_null and c not in expected]
    if not wrong:
        return
    # Another layout: no writer may stage into it while we look (rows of open batches
    # become visible, or wait for us), and rows of runs that hold no split are dead.
    execute(conn, sql.SQL("LOCK TABLE {} IN ACCESS EXCLUSIVE MODE").format(layout.staging))
    run_id = KEY_COLUMNS[0][0]
    if run_id in present:
        execute(conn, _sweep_query(layout.staging))
    live = conn.exec_driver_sql(
        sql.SQL("SELECT EXISTS (SELECT FROM {})").format(layout.staging).as_string()
    ).scalar_one()
    if live:
        raise ConfigError(
            setting,
            f"{layout.schema}.{name} has another layout (column(s) {', '.join(sorted(wrong))})"
            " and a live run still has rows staged in it",
        )
    _log.info("rebuilding %s.%s for a changed output layout", layout.schema, name)
    execute(conn, sql.SQL("DROP TABLE {}").format(layout.staging))
    execute(conn, create)


def _sweep_query(staging: sql.Identifier) -> sql.Composed:
    return sql.SQL(
        "DELETE FROM {} WHERE {} NOT IN (SELECT run_id FROM {}"
        " WHERE status IN ('ASSIGNED', 'READING') AND run_id IS NOT NULL)"
    ).format(staging, sql.Identifier(KEY_COLUMNS[0][0]), sql.Identifier(SCHEMA, splits.name))


def sweep_staged(engine: Engine, schema: str, table: str) -> int:
    """Delete staged rows of runs that hold no split any more; how many were deleted.

    Run it after :func:`~enumerator_service.recover`: what a dead run staged can then never
    commit (its uncommitted transactions were aborted, committed ones were moved).
    """
    _, staging = table_names(schema, table)
    with engine.begin() as conn:
        deleted = execute(conn, _sweep_query(staging))
    if deleted:
        _log.info("deleted %d staged rows of dead runs from %s.%s", deleted, schema, table)
    return deleted
