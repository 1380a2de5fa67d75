"""A table per staged batch: where a Postgres sink's writer stages what it wrote between two
pre-commits, and what the commit moves into the target and drops.

One batch (a task attempt's rows between two pre-commits) is one table
``<schema>.__sluice_staged_<24 hex>`` in the target's schema, named by a hash of the target
and the staging key (run, subtask, attempt, batch). The writer creates it in the batch's own
transaction, so a batch that never pre-commits leaves nothing (the table rolls back with it),
and loads it with ``COPY … FREEZE`` (allowed in the creating transaction: no hint bits or
freezing left for a later scan or vacuum). The table holds the sequence number and the output
columns, no key columns (the table is the key), no index.

Why not one shared staging table (the design until issue 25): the completion's ``DELETE …
RETURNING`` of the moved rows and the vacuum of their dead tuples were most of a change
stream's move, and every row carried the 4 key columns through COPY. A batch table is read
once and dropped in the completion transaction.

The table's comment holds its target and run (JSON) so that :func:`dead_batch_tables` can
find what attempts that died after a pre-commit left behind, which no ``sink_transactions``
row names.

Threading: pure functions building SQL, and blocking queries on the caller's connection.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Mapping
from typing import Any

import pyarrow as pa
import sqlalchemy as sa
from psycopg import sql
from sqlalchemy.engine import Connection

from enumerator_service import splits
from spark_jobs.pipeline._errors import RESERVED_PREFIX
from spark_jobs.pipeline._types import postgres_type
from spark_jobs.sink._table_layout import PARTITION_COLUMN, SEQ_COLUMN, TableLayout

__all__ = [
    "BATCH_TABLE_PREFIX",
    "batch_table_ddl",
    "batch_table_name",
    "batch_tables",
    "checked_batch_table",
    "dead_batch_tables",
    "drop_batch_tables",
    "staged_rows",
    "table_rows",
]

BATCH_TABLE_PREFIX = f"{RESERVED_PREFIX}_staged_"
_NAME = re.compile(re.escape(BATCH_TABLE_PREFIX) + r"[0-9a-f]{24}")

_TABLES = sa.text(
    "SELECT c.relname, obj_description(c.oid, 'pg_class') FROM pg_class c"
    " JOIN pg_namespace n ON n.oid = c.relnamespace"
    " WHERE n.nspname = :schema AND c.relkind = 'r' AND starts_with(c.relname, :prefix)"
)
_LIVE_RUNS = (
    sa.select(splits.c.run_id)
    .where(splits.c.status.in_(["ASSIGNED", "READING"]), splits.c.run_id.is_not(None))
    .distinct()
)


def batch_table_name(layout: TableLayout, key: tuple[str, int, str, int]) -> str:
    """The batch table of staging key ``key`` (run, subtask, attempt, batch) of ``layout``."""
    identity = json.dumps([layout.schema, layout.table, *key])
    return BATCH_TABLE_PREFIX + hashlib.sha256(identity.encode()).hexdigest()[:24]


def checked_batch_table(name: object) -> str:
    """``name`` if it is a batch table's name (read back from a staged entry), else
    ValueError: only such names reach SQL."""
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise ValueError(f"{name!r} is not a staged batch table")
    return name


def batch_table_ddl(
    layout: TableLayout, name: str, columns: pa.Schema, run_id: str
) -> list[sql.Composed]:
    """The statements creating batch table ``name``: the sequence number, the output
    columns (nullable: the target checks) and ``dt`` when partitioned; its comment names the
    target and the run (for :func:`dead_batch_tables`)."""
    table = sql.Identifier(layout.schema, checked_batch_table(name))
    kinds = [(f.name, postgres_type(f.type)) for f in columns]
    if layout.partitioned:
        kinds.append((PARTITION_COLUMN, "date"))
    definitions = [sql.SQL("{} bigint NOT NULL").format(sql.Identifier(SEQ_COLUMN))]
    definitions += [sql.SQL("{} {}").format(sql.Identifier(n), sql.SQL(k)) for n, k in kinds]
    owner = json.dumps({"target": layout.table, "run_id": run_id})
    return [
        sql.SQL("CREATE TABLE {} ({})").format(table, sql.SQL(", ").join(definitions)),
        sql.SQL("COMMENT ON TABLE {} IS {}").format(table, sql.Literal(owner)),
    ]


def _owner(comment: str | None) -> Mapping[str, Any]:
    try:
        owner = json.loads(comment or "")
    except ValueError:
        return {}
    return owner if isinstance(owner, dict) else {}


def _owned(conn: Connection, schema: str, table: str) -> list[tuple[str, Any]]:
    """(name, run id in its comment) of every batch table of sink ``schema.table``."""
    found = conn.execute(_TABLES, {"schema": schema, "prefix": BATCH_TABLE_PREFIX})
    owned = []
    for name, comment in found:
        owner = _owner(comment)
        if _NAME.fullmatch(name) and owner.get("target") == table:
            owned.append((str(name), owner.get("run_id")))
    return sorted(owned)


def dead_batch_tables(conn: Connection, schema: str, table: str) -> list[str]:
    """The batch tables of sink ``schema.table`` staged by runs that hold no split any more
    (what they staged can never commit once recovery has run)."""
    live = set(conn.execute(_LIVE_RUNS).scalars())
    return [name for name, run_id in _owned(conn, schema, table) if run_id not in live]


def drop_batch_tables(schema: str, names: Iterable[str]) -> sql.Composed | None:
    """``DROP TABLE IF EXISTS`` of the batch tables ``names`` (None when there are none)."""
    tables = [sql.Identifier(schema, checked_batch_table(n)) for n in sorted(set(names))]
    if not tables:
        return None
    return sql.SQL("DROP TABLE IF EXISTS {}").format(sql.SQL(", ").join(tables))


def batch_tables(conn: Connection, schema: str, table: str) -> list[str]:
    """Every batch table of sink ``schema.table`` (committed and not yet moved, or dead)."""
    return [name for name, _ in _owned(conn, schema, table)]


def staged_rows(conn: Connection, schema: str, table: str) -> int:
    """Rows staged for sink ``schema.table`` and not moved yet (all its batch tables)."""
    return sum(table_rows(conn, schema, name) for name in batch_tables(conn, schema, table))


def table_rows(conn: Connection, schema: str, name: str) -> int:
    """The rows of batch table ``name``."""
    query = sql.SQL("SELECT count(*) FROM {}").format(
        sql.Identifier(schema, checked_batch_table(name))
    )
    return int(conn.exec_driver_sql(query.as_string()).scalar_one())
