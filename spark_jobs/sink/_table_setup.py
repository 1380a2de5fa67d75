"""Setting up a Postgres sink table before a run, and removing what dead runs staged.

:func:`ensure_tables` creates the schema and the target table when they are missing and
checks a target that exists: it must have every output column and no other NOT NULL column
without a default, and an upsert sink needs a unique index or constraint on exactly its key
(``ON CONFLICT`` infers it). Staged rows live in a table per batch (``_batch_tables``), each
of its own layout, created by the writer.

:func:`sweep_staged`: a batch pre-committed by an attempt that died before acknowledging has
no ``sink_transactions`` row; the driver drops the batch tables of runs that hold no split
(after recovery, at the start and at the end of every run), and empties and then drops the
shared staging table a sink had before the batch tables.

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
from spark_jobs.sink._batch_tables import dead_batch_tables, drop_batch_tables, table_rows
from spark_jobs.sink._table_layout import (
    KEY_COLUMNS,
    PARTITION_COLUMN,
    TableLayout,
    column_list,
    execute,
    existing_staging,
)

__all__ = ["check_existing_target", "ensure_tables", "sweep_staged"]

_log = logging.getLogger(__name__)

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
    """Create the target table of sink ``schema_name.table`` if missing.

    ``columns``: the pipeline's output schema (the target gets these columns, then ``dt
    date`` when ``partitioned``, and ``PRIMARY KEY (upsert_key)`` when upserting). A
    ConfigError (one line, setting ``sink <schema>.<table>``) when an existing target lacks
    an output column or has a NOT NULL column without a default that the output does not
    fill, or when an upsert sink's target has no unique index or constraint on exactly the
    key columns. Column types of an existing target are not checked (INSERT casts). Run by
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


def _sweep_query(staging: sql.Identifier) -> sql.Composed:
    return sql.SQL(
        "DELETE FROM {} WHERE {} NOT IN (SELECT run_id FROM {}"
        " WHERE status IN ('ASSIGNED', 'READING') AND run_id IS NOT NULL)"
    ).format(staging, sql.Identifier(KEY_COLUMNS[0][0]), sql.Identifier(SCHEMA, splits.name))


def _sweep_legacy(conn: Connection, schema: str, table: str) -> int:
    """Rows of dead runs in the shared staging table of a sink from before the batch tables;
    the table itself once it holds no rows (nothing stages into it any more)."""
    staging = existing_staging(conn, schema, table)
    if staging is None:
        return 0
    deleted = execute(conn, _sweep_query(staging))
    left = conn.exec_driver_sql(
        sql.SQL("SELECT EXISTS (SELECT FROM {})").format(staging).as_string()
    ).scalar_one()
    if not left:
        execute(conn, sql.SQL("DROP TABLE {}").format(staging))
    return deleted


def sweep_staged(engine: Engine, schema: str, table: str) -> int:
    """Drop the batch tables of runs that hold no split any more; how many rows they held.

    Run it after :func:`~enumerator_service.recover`: what a dead run staged can then never
    commit (its uncommitted transactions were aborted, committed ones were moved).
    """
    with engine.begin() as conn:
        dead = dead_batch_tables(conn, schema, table)
        deleted = sum(table_rows(conn, schema, name) for name in dead)
        drop = drop_batch_tables(schema, dead)
        if drop is not None:
            execute(conn, drop)
        deleted += _sweep_legacy(conn, schema, table)
    if deleted:
        _log.info("dropped %d staged row(s) of dead runs of %s.%s", deleted, schema, table)
    return deleted
