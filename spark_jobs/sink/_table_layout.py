"""The shape of a Postgres sink table and of its staging table, shared by the writer, the
commit side and the table setup; the names in it are validated every time one is built, so
a staged entry read back from ``sink_transactions`` is checked again before any SQL.

Staging table ``<schema>.<table>__staged``: the staging key (run, subtask, attempt, batch)
and a sequence number, all named with the reserved ``__sluice`` prefix so that no output
field can collide with them, then the output columns (and ``dt`` when partitioned).

Threading: immutable values and pure functions, any thread.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from psycopg import sql
from sqlalchemy.engine import Connection

from enumerator_service import ConfigError, validate_identifier
from spark_jobs.pipeline._errors import RESERVED_PREFIX, check_field_name

__all__ = [
    "BORN_COLUMN",
    "CREATED_OP",
    "ENTRY_KEY",
    "KEY_COLUMNS",
    "PARTITION_COLUMN",
    "SEQ_COLUMN",
    "STAGING_SUFFIX",
    "TABLE_SINK_NAME",
    "TableLayout",
    "column_list",
    "execute",
    "existing_staging",
    "missing_tables",
    "same_key",
    "set_from",
    "staging_table",
    "stored_not_later",
    "table_names",
    "winners",
]

TABLE_SINK_NAME = "postgres"
STAGING_SUFFIX = "__staged"
#: The date column of a day-partitioned output.
PARTITION_COLUMN = "dt"
#: (column, SQL type) of the staging key: one batch is what a task attempt staged between
#: two pre-commits.
KEY_COLUMNS: tuple[tuple[str, str], ...] = (
    (f"{RESERVED_PREFIX}_run_id", "text"),
    (f"{RESERVED_PREFIX}_subtask", "integer"),
    (f"{RESERVED_PREFIX}_attempt", "text"),
    (f"{RESERVED_PREFIX}_batch", "bigint"),
)
#: A row's place within its batch (1, 2, …): the last staged row of a key wins an upsert.
SEQ_COLUMN = f"{RESERVED_PREFIX}_seq"
#: A change stream's batch tables (``op_field``): whether the row's key was created in its
#: hand-over (its first change there has the operation ``CREATED_OP``, an insert): the key
#: had no row before it, so the commit inserts such a winner without looking for one
#: (``_table_merge``; a stored row after all makes the insert fail and the commit take the
#: general path).
BORN_COLUMN = f"{RESERVED_PREFIX}_born"
#: The operation of a change that created its key (a change-data-capture insert).
CREATED_OP = "c"
#: The staging key's fields in a staged entry, in KEY_COLUMNS order.
ENTRY_KEY = ("run_id", "subtask", "attempt", "batch")


def staging_table(table: str) -> str:
    return f"{table}{STAGING_SUFFIX}"


def table_names(schema: str, table: str) -> tuple[sql.Identifier, sql.Identifier | None]:
    """(target, shared staging table) as quoted identifiers, after validating the names.

    The shared staging table ``<table>__staged`` is only read to finish or sweep what a
    sink staged before the batch tables; sink table names were at most 55 characters then,
    so a longer one has none (None: its name would not fit Postgres' 63)."""
    validate_identifier(schema, "sink schema")
    legacy = staging_table(validate_identifier(table, "sink table"))
    try:
        staging: sql.Identifier | None = sql.Identifier(schema, validate_identifier(legacy))
    except ConfigError:  # (only its length can fail it, the table's name passed)
        staging = None
    return sql.Identifier(schema, table), staging


def column_list(names: Iterable[str], prefix: str | None = None) -> sql.Composed:
    """``"a", "b"`` (or ``p."a", p."b"``): quoted, so mixed case and reserved words work."""
    return sql.SQL(", ").join(
        sql.Identifier(prefix, n) if prefix else sql.Identifier(n) for n in names
    )


def execute(conn: Connection, query: sql.Composable, **params: Any) -> int:
    """Run a psycopg-composed statement on a SQLAlchemy connection (its transaction)."""
    return int(conn.exec_driver_sql(query.as_string(), params).rowcount)


def missing_tables(conn: Connection, schema: str, names: Sequence[str]) -> list[str]:
    """Which of the tables ``names`` of ``schema`` do not exist."""
    found = conn.exec_driver_sql(
        "SELECT n FROM unnest(CAST(%(names)s AS text[])) AS n"
        " WHERE to_regclass(quote_ident(%(schema)s) || '.' || quote_ident(n)) IS NULL",
        {"names": list(names), "schema": schema},
    )
    return sorted(str(row[0]) for row in found)


def existing_staging(conn: Connection, schema: str, table: str) -> sql.Identifier | None:
    """The shared staging table of sink ``schema.table`` from before the batch tables, if
    it has one (None: it never had one, or it was dropped once empty)."""
    staging = table_names(schema, table)[1]
    if staging is None or missing_tables(conn, schema, [staging_table(table)]):
        return None
    return staging


def winners(layout: TableLayout, extra: Sequence[str] = ()) -> sql.Composed:
    """The query of an upsert's rows from the staged rows ``moved`` (batch, sequence,
    columns): one per key, the latest ``latest_by`` (a null one oldest), then the last staged
    (highest batch, then sequence); ``extra``: staging columns selected before the output
    columns."""
    assert layout.upsert_key is not None
    key = column_list(layout.upsert_key)
    newest: sql.Composable = sql.SQL("")
    if layout.latest_by is not None:
        newest = sql.SQL("{} DESC NULLS LAST, ").format(sql.Identifier(layout.latest_by))
    return sql.SQL(
        "SELECT DISTINCT ON ({key}) {columns} FROM moved ORDER BY {key}, {newest}{batch} DESC,"
        " {seq} DESC"
    ).format(
        key=key,
        columns=column_list([*extra, *layout.names]),
        newest=newest,
        batch=sql.Identifier(KEY_COLUMNS[3][0]),
        seq=sql.Identifier(SEQ_COLUMN),
    )


def stored_not_later(layout: TableLayout, source: str) -> sql.Composed:
    """The condition under which an upsert replaces (or deletes) the ``stored`` row with the
    ``source`` one (an alias: ``w``, ``EXCLUDED``): the stored row is not of a later
    ``latest_by`` (a stored row without one is older than any)."""
    assert layout.latest_by is not None
    return sql.SQL("stored.{c} IS NULL OR stored.{c} <= {s}.{c}").format(
        c=sql.Identifier(layout.latest_by), s=sql.SQL(source)
    )


def set_from(layout: TableLayout, source: str) -> sql.Composed | None:
    """``column = <source>.column, …`` for the output columns outside the upsert key; None
    when there are none (the upsert then has nothing to update)."""
    assert layout.upsert_key is not None
    others = [n for n in layout.names if n not in layout.upsert_key]
    if not others:
        return None
    return sql.SQL(", ").join(
        sql.SQL("{0} = {s}.{0}").format(sql.Identifier(n), s=sql.SQL(source)) for n in others
    )


def same_key(layout: TableLayout, source: str) -> sql.Composed:
    """``stored.k = <source>.k AND …`` over the upsert key."""
    assert layout.upsert_key is not None
    return sql.SQL(" AND ").join(
        sql.SQL("stored.{0} = {s}.{0}").format(sql.Identifier(n), s=sql.SQL(source))
        for n in layout.upsert_key
    )


def _field_names(names: object, what: str) -> tuple[str, ...]:
    if isinstance(names, str) or not isinstance(names, Sequence):
        raise ValueError(f"{what} must be a list of names, got {names!r}")
    checked = tuple(check_field_name(name, what) for name in names)
    if len(set(checked)) != len(checked):
        raise ValueError(f"{what} {list(checked)!r} names a field twice")
    return checked


@dataclass(frozen=True, slots=True)
class TableLayout:
    """A sink table: where it is, its output columns, whether it has the ``dt`` column, and
    the upsert key (None: rows are appended), and the column whose greatest value wins an
    upsert (``latest_by``; None: the last staged row). Validated when built."""

    schema: str
    table: str
    columns: tuple[str, ...]
    partitioned: bool
    upsert_key: tuple[str, ...] | None
    latest_by: str | None = None
    #: The column whose value ``"d"`` deletes the key instead of upserting it (a change
    #: stream's operation; needs ``latest_by``), or None.
    op_field: str | None = None

    def __post_init__(self) -> None:
        table_names(self.schema, self.table)
        _field_names(self.columns, "column")
        if not self.columns:
            raise ValueError(f"sink {self.qualified} has no columns")
        if not isinstance(self.partitioned, bool):
            raise ValueError(f"partitioned must be true or false, got {self.partitioned!r}")
        if self.partitioned and PARTITION_COLUMN in self.columns:
            raise ValueError(
                f"column {PARTITION_COLUMN!r} collides with the partition column of a "
                "day-partitioned output"
            )
        if self.upsert_key is not None:
            key = _field_names(self.upsert_key, "upsert_key field")
            missing = [name for name in key if name not in self.columns]
            if not key or missing:
                raise ValueError(
                    f"upsert_key {list(key)!r} must name output columns"
                    f" (columns: {', '.join(self.columns)})"
                )
        if self.latest_by is not None and (
            self.upsert_key is None or self.latest_by not in self.columns
        ):
            raise ValueError(f"latest_by {self.latest_by!r} must be an output column of an upsert")
        if self.op_field is not None and (
            self.latest_by is None or self.op_field not in self.columns
        ):
            raise ValueError(f"op_field {self.op_field!r} must be an output column of an upsert")

    @classmethod
    def build(
        cls,
        schema: str,
        table: str,
        columns: Sequence[str],
        *,
        partitioned: bool,
        upsert_key: Sequence[str] | None,
        latest_by: str | None = None,
        op_field: str | None = None,
    ) -> TableLayout:
        key = None if upsert_key is None else tuple(upsert_key)
        return cls(schema, table, tuple(columns), partitioned, key, latest_by, op_field)

    @classmethod
    def from_entry(cls, entry: Mapping[str, Any]) -> TableLayout:
        """The layout a staged entry describes (ValueError if any name in it is invalid)."""
        key = entry.get("upsert_key")
        return cls(
            entry["schema"],
            entry["table"],
            _field_names(entry["columns"], "column"),
            entry["partitioned"],
            None if key is None else _field_names(key, "upsert_key field"),
            entry.get("latest_by"),
            entry.get("op_field"),
        )

    def entry(self) -> dict[str, Any]:
        """The layout's part of a staged entry (JSON)."""
        entry: dict[str, Any] = {
            "schema": self.schema,
            "table": self.table,
            "columns": list(self.columns),
            "partitioned": self.partitioned,
            "upsert_key": None if self.upsert_key is None else list(self.upsert_key),
        }
        if self.latest_by is not None:
            entry["latest_by"] = self.latest_by
        if self.op_field is not None:
            entry["op_field"] = self.op_field
        return entry

    @property
    def qualified(self) -> str:
        return f"{self.schema}.{self.table}"

    @property
    def target(self) -> sql.Identifier:
        return table_names(self.schema, self.table)[0]

    @property
    def staging(self) -> sql.Identifier | None:
        return table_names(self.schema, self.table)[1]

    @property
    def names(self) -> tuple[str, ...]:
        """The target's columns this sink writes: the output's, then ``dt`` if partitioned."""
        return (*self.columns, PARTITION_COLUMN) if self.partitioned else self.columns
