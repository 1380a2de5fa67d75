"""The catalog and SQL side of :class:`~spark_jobs.lookup.BatchLookup`.

:func:`read_shape` reads the lookup table's columns from the catalog (``format_type`` with
the type modifier, so ``numeric(12,6)`` reads as ``decimal(12,6)``), checks the step against
them and builds the two statements, with quoted identifiers and bound parameters only:

- the *query* of one chunk of distinct keys, one result row of arrays:
  one key part ``SELECT array_agg(k), array_agg(c)… FROM t WHERE k = ANY($1::<type>[])``;
  a composite key ``… FROM unnest($1::t1[], $2::t2[]) AS _q(…) JOIN t AS _t ON …``, or,
  when a btree index of the table begins with exactly the key's columns, the same keys
  probed one by one through it (``CROSS JOIN LATERAL (… OFFSET 0)``: the fence keeps the
  planner from turning the probes back into a join). Without it the planner hashed the
  whole table for every chunk (a chunk's few thousand keys look cheaper to join than to
  probe): 7.5 ms a chunk of 3,400 keys on a 100k-row table, growing with the table,
  against 4.5 ms probing, whatever its size;
- the *load* of the whole table (key and looked-up columns, rows with a null key part left
  out) for the full cache.

Both sides of a key part are compared in one *join type* (integers as int64, timestamps as
epoch microseconds, decimals at the larger scale, …): keys are bound in their family's widest
Postgres type (``int8``, ``float8``, ``numeric``, ``text``), so a record key never needs to
fit the column's narrower type and an index on the column still serves the comparison.
Timestamps travel as epoch microseconds (asyncpg's datetime decoding costs several times an
int8's; ``±infinity`` reads as null); columns ``catalog_arrow_type`` reads as text are
selected ``::text`` (and a key column of such a type is compared as text).

Threading: ``read_shape`` runs on the lookup's event loop; the shapes are immutable.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import asyncpg
import pyarrow as pa

from enumerator_service import ConfigError
from spark_jobs.pipeline._errors import quote
from spark_jobs.pipeline._plan import LookupPlan
from spark_jobs.pipeline._types import catalog_arrow_type, type_family, type_name

__all__ = ["KeyPart", "LookupShape", "ValueColumn", "read_shape"]

_CATALOG = """
SELECT attname, format_type(atttypid, atttypmod)
FROM pg_catalog.pg_attribute
WHERE attrelid = $1 AND attnum > 0 AND NOT attisdropped
"""
#: The leading columns of each valid, whole-table btree index (an expression column is null).
_INDEXES = """
SELECT array_agg(a.attname ORDER BY k.ord)
FROM pg_catalog.pg_index AS i
JOIN pg_catalog.pg_class AS c ON c.oid = i.indexrelid
JOIN pg_catalog.pg_am AS am ON am.oid = c.relam
CROSS JOIN LATERAL unnest(i.indkey::int2[]) WITH ORDINALITY AS k(attnum, ord)
LEFT JOIN pg_catalog.pg_attribute AS a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
WHERE i.indrelid = $1 AND i.indisvalid AND i.indpred IS NULL AND am.amname = 'btree'
GROUP BY i.indexrelid
"""

#: Family → (join type, Postgres type the distinct keys are bound as).
_BIND: dict[str, tuple[pa.DataType, str]] = {
    "integer": (pa.int64(), "int8"),
    "float": (pa.float64(), "float8"),
    "string": (pa.string(), "text"),
    "bool": (pa.bool_(), "bool"),
    "date": (pa.date32(), "date"),
    "binary": (pa.binary(), "bytea"),
}


@dataclass(frozen=True, slots=True)
class KeyPart:
    """One part of the key: record ``field`` against table ``column``.

    ``join_type``: the Arrow type both sides are compared in; ``param``: the Postgres type the
    keys are bound as; ``bind_type``: what the join-typed keys are cast to before they are
    turned into Python values for asyncpg (timestamps: datetimes of the column's kind), or
    None; ``as_text``: the column is compared (and read) as text.
    """

    field: str
    column: str
    sql_type: str
    join_type: pa.DataType
    param: str
    bind_type: pa.DataType | None
    as_text: bool

    def returned(self, expression: str) -> str:
        """``expression`` (this key part, table or query side) as it is selected: string keys
        as ``text`` (a ``character(n)`` column's padding goes, as in its comparison with a
        text key), timestamps as epoch microseconds."""
        if self.bind_type is not None:
            return _epoch_micros(expression)
        return f"{expression}::text" if self.param == "text" else expression

    def compared(self, expression: str) -> str:
        """The table side of the key comparison."""
        return f"{expression}::text" if self.as_text else expression


@dataclass(frozen=True, slots=True)
class ValueColumn:
    """A looked-up ``column``, added as ``output`` of Arrow ``type``; ``expression`` selects it."""

    column: str
    output: str
    type: pa.DataType
    expression: str


@dataclass(frozen=True, slots=True)
class LookupShape:
    keys: tuple[KeyPart, ...]
    values: tuple[ValueColumn, ...]
    query: str
    load: str


async def read_shape(
    conn: asyncpg.Connection,
    plan: LookupPlan,
    input_schema: pa.Schema,
    column_types: Mapping[str, pa.DataType],
) -> LookupShape:
    """The checked shape of ``plan``'s lookup; a one-line ConfigError naming the step
    (``plan.where``) for a missing table or column, a key field whose type family differs
    from its column's, or a looked-up column whose type changed since the run resolved it."""
    qualified = f"{quote(plan.schema_name)}.{quote(plan.table)}"
    oid = await conn.fetchval("SELECT to_regclass($1)::oid", qualified)
    if oid is None:
        raise ConfigError(plan.where, f"lookup table {plan.qualified} does not exist")
    catalog: dict[str, str] = dict(await conn.fetch(_CATALOG, oid))
    for column in (*(c for _, c in plan.keys), *(c for c, _ in plan.columns)):
        if column not in catalog:
            raise ConfigError(plan.where, f"lookup table {plan.qualified} has no column {column}")
    keys = tuple(
        _key_part(plan, field, column, catalog[column], input_schema.field(field).type)
        for field, column in plan.keys
    )
    values = tuple(
        _value_column(plan, column, output, catalog[column], column_types.get(column))
        for column, output in plan.columns
    )
    probed = len(keys) > 1 and _indexed(await conn.fetch(_INDEXES, oid), keys)
    return LookupShape(
        keys,
        values,
        _query(qualified, keys, values, probe=probed),
        _load(qualified, keys, values),
    )


def _indexed(indexes: Sequence[asyncpg.Record], keys: Sequence[KeyPart]) -> bool:
    """Whether one of ``indexes`` (their columns in order) begins with exactly the key's
    columns, every one compared bare (a ``::text`` comparison cannot use it)."""
    if any(k.as_text for k in keys):
        return False
    wanted = {k.column for k in keys}
    return any(set(list(columns)[: len(keys)]) == wanted for (columns,) in indexes)


def _key_part(
    plan: LookupPlan, field: str, column: str, sql_type: str, field_type: pa.DataType
) -> KeyPart:
    column_type, as_text = catalog_arrow_type(sql_type)
    family = type_family(field_type)
    if family != type_family(column_type):
        raise ConfigError(
            plan.where,
            f"key field {field} is {type_name(field_type)} but {plan.qualified}.{column} is "
            f"{sql_type}: the types must be of one family",
        )
    if family in _BIND:
        join_type, param = _BIND[family]
        return KeyPart(field, column, sql_type, join_type, param, None, as_text)
    if family == "decimal":
        scale = max(field_type.scale, column_type.scale)
        return KeyPart(field, column, sql_type, pa.decimal128(38, scale), "numeric", None, False)
    if family == "timestamp":
        param = "timestamptz" if column_type.tz else "timestamp"
        return KeyPart(field, column, sql_type, pa.int64(), param, column_type, False)
    raise ConfigError(
        plan.where, f"key field {field}: {type_name(field_type)} keys are not supported"
    )


def _value_column(
    plan: LookupPlan, column: str, output: str, sql_type: str, resolved: pa.DataType | None
) -> ValueColumn:
    kind, as_text = catalog_arrow_type(sql_type)
    if resolved is not None and resolved != kind:
        raise ConfigError(
            plan.where,
            f"column {plan.qualified}.{column} is now {sql_type} ({type_name(kind)}); the run "
            f"resolved it as {type_name(resolved)}",
        )
    expression = f"_t.{quote(column)}"
    if pa.types.is_timestamp(kind):
        expression = _epoch_micros(expression)
    elif as_text:
        expression = f"{expression}::text"
    return ValueColumn(column, output, kind, expression)


def _epoch_micros(expression: str) -> str:
    """Epoch microseconds; ``±infinity`` (no Arrow timestamp holds it) becomes null."""
    return (
        f"CASE WHEN isfinite({expression}) "
        f"THEN (extract(epoch FROM {expression}) * 1000000)::int8 END"
    )


def _query(
    qualified: str,
    keys: Sequence[KeyPart],
    values: Sequence[ValueColumn],
    *,
    probe: bool = False,
) -> str:
    if len(keys) == 1:
        (key,) = keys
        column = f"_t.{quote(key.column)}"
        selected = [key.returned(column), *(v.expression for v in values)]
        arrays = ", ".join(f"array_agg({expression})" for expression in selected)
        return (
            f"SELECT {arrays} FROM {qualified} AS _t "
            f"WHERE {key.compared(column)} = ANY($1::{key.param}[])"
        )
    # The query side's key values come back: they are the record's, in the join type.
    selected = [
        *(k.returned(f"_q.{quote(k.column)}") for k in keys),
        *(v.expression for v in values),
    ]
    arrays = ", ".join(f"array_agg({expression})" for expression in selected)
    params = ", ".join(f"${i}::{k.param}[]" for i, k in enumerate(keys, start=1))
    aliases = ", ".join(quote(k.column) for k in keys)
    on = " AND ".join(f"{k.compared(f'_t.{quote(k.column)}')} = _q.{quote(k.column)}" for k in keys)
    keys_of = f"SELECT {arrays} FROM unnest({params}) AS _q({aliases})"
    if probe:
        return (
            f"{keys_of} CROSS JOIN LATERAL "
            f"(SELECT * FROM {qualified} AS _t WHERE {on} OFFSET 0) AS _t"
        )
    return f"{keys_of} JOIN {qualified} AS _t ON {on}"


def _load(qualified: str, keys: Sequence[KeyPart], values: Sequence[ValueColumn]) -> str:
    selected = [
        *(k.returned(f"_t.{quote(k.column)}") for k in keys),
        *(v.expression for v in values),
    ]
    complete = " AND ".join(f"_t.{quote(k.column)} IS NOT NULL" for k in keys)
    return f"SELECT {', '.join(selected)} FROM {qualified} AS _t WHERE {complete}"
