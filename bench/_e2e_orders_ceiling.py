"""``bench/e2e.py``: the orders ceiling — the orders example's work without the platform.

``CORES`` spawned processes (the ``Ceilings`` pool), each over every ``CORES``-th orders file:
the file read in blocks of whole lines, each block parsed by ``pyarrow.csv`` as text, rows
with a missing or unconvertible field dropped (regular expressions per column), the rest
converted to the orders' types, ``crm.customers`` looked up per block on its composite key
(one query of the block's distinct keys, probed through the key's index like Sluice's), the
small ``ref.fx_rates`` read once per process and joined in Arrow (unknown currencies
dropped), ``amount_eur`` computed and non-positive amounts dropped, then the block COPied into
one unindexed staging table. When both processes are done, one transaction moves every staged
row into the upsert target (``DISTINCT ON`` the key, ``INSERT … ON CONFLICT DO UPDATE``) and the
staging table is dropped: the least Postgres work an exactly-once upsert that stages its output
does — no checkpoints, one commit, no ``DELETE`` of staged rows.
"""

from __future__ import annotations

import asyncio
import io
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
from _e2e_ceiling import line_blocks

from examples.orders import add_amount_eur

__all__ = ["OUTPUT", "move_sql", "orders_job", "staging_sql"]

_UTC = pa.timestamp("us", tz="UTC")
_COLUMNS = ["order_id", "tenant_id", "customer_id", "currency", "amount", "ordered_at"]
_TYPES = {
    "order_id": pa.string(),
    "tenant_id": pa.int64(),
    "customer_id": pa.int64(),
    "currency": pa.string(),
    "amount": pa.decimal128(12, 2),
    "ordered_at": _UTC,
}
#: The target's columns, as the example's sink writes them (``dt`` = the order's UTC day).
OUTPUT = (
    ("order_id", "text PRIMARY KEY"),
    ("tenant_id", "bigint"),
    ("customer_id", "bigint"),
    ("currency", "text"),
    ("amount", "numeric(12,2)"),
    ("ordered_at", "timestamptz"),
    ("customer_name", "text"),
    ("segment", "text"),
    ("rate_to_eur", "numeric(12,6)"),
    ("amount_eur", "numeric(18,2)"),
    ("dt", "date"),
)
_NAMES = [name for name, _ in OUTPUT]
_CUSTOMERS = (
    "SELECT array_agg(_t.tenant_id), array_agg(_t.id), array_agg(_t.name), "
    "array_agg(_t.segment) FROM unnest($1::int8[], $2::int8[]) AS _q(tenant_id, id) "
    "CROSS JOIN LATERAL (SELECT * FROM crm.customers AS _t WHERE _t.tenant_id = _q.tenant_id "
    "AND _t.id = _q.id OFFSET 0) AS _t"
)


def staging_sql(staging: str) -> str:
    """The unindexed staging table (``seq`` orders the rows of one key: the last one wins)."""
    columns = ", ".join(
        f"{name} {'timestamp' if name == 'ordered_at' else kind.split()[0]}"
        for name, kind in OUTPUT
    )
    return f"CREATE UNLOGGED TABLE {staging} (seq bigserial, {columns})"


def move_sql(staging: str, target: str) -> str:
    """Every staged row into the target, one row per key, the staged timestamps read as UTC."""
    names = ", ".join(_NAMES)
    picked = ", ".join(
        "ordered_at AT TIME ZONE 'UTC'" if name == "ordered_at" else name for name in _NAMES
    )
    update = ", ".join(f"{name} = EXCLUDED.{name}" for name in _NAMES[1:])
    return (
        f"INSERT INTO {target} ({names}) SELECT DISTINCT ON (order_id) {picked} FROM {staging}"
        f" ORDER BY order_id, seq DESC ON CONFLICT (order_id) DO UPDATE SET {update}"
    )


#: Per column: the text a value must match to convert (checked column-wise, so that a bad value
#: drops its row instead of failing the block — what Sluice dead-letters).
_VALID = {
    "tenant_id": r"^-?[0-9]+$",
    "customer_id": r"^-?[0-9]+$",
    "amount": r"^-?[0-9]{1,10}(\.[0-9]{1,2})?$",
    "ordered_at": r"^[0-9]{4}-[0-9]{2}-[0-9]{2}[T ][0-9]{2}:[0-9]{2}:[0-9]{2}",
}


def _parse(block: bytes) -> pa.Table:
    """The block's rows with every field present and convertible, typed; lines with another
    number of fields are skipped."""
    read = pacsv.ReadOptions(column_names=_COLUMNS, use_threads=False)
    parse = pacsv.ParseOptions(invalid_row_handler=lambda row: "skip")
    convert = pacsv.ConvertOptions(column_types=dict.fromkeys(_COLUMNS, pa.string()))
    table = pacsv.read_csv(io.BytesIO(block), read, parse, convert).drop_null()
    valid = None
    for name, pattern in _VALID.items():
        matches = pc.match_substring_regex(table.column(name), pattern)
        valid = matches if valid is None else pc.and_(valid, matches)
    table = table.filter(valid)
    return pa.table([table.column(n).cast(_TYPES[n]) for n in _COLUMNS], names=_COLUMNS)


def _enrich(table: pa.Table, found: Any, rates: pa.Table) -> pa.Table:
    customers = pa.table(
        {
            "tenant_id": pa.array(found[0] or [], pa.int64()),
            "customer_id": pa.array(found[1] or [], pa.int64()),
            "customer_name": pa.array(found[2] or [], pa.string()),
            "segment": pa.array(found[3] or [], pa.string()),
        }
    )
    table = table.join(customers, ["tenant_id", "customer_id"], join_type="left outer")
    table = table.join(rates, "currency", "code", join_type="inner")
    batch = add_amount_eur(table.combine_chunks().to_batches()[0])
    zero = pa.scalar(Decimal(0), batch.schema.field("amount_eur").type)
    table = pa.Table.from_batches([batch.filter(pc.greater(batch.column("amount_eur"), zero))])
    ordered_at = table.column("ordered_at")
    day = pc.cast(pc.floor_temporal(ordered_at, unit="day"), pa.date32())
    # Staged as naive UTC text (the move reads it AT TIME ZONE 'UTC'): Arrow renders a zoned
    # timestamp for CSV through its time-zone database, per value.
    naive = ordered_at.cast(pa.timestamp("us"))
    index = table.schema.get_field_index("ordered_at")
    table = table.set_column(index, "ordered_at", naive).append_column("dt", day)
    return table.select(_NAMES)


async def _run(files: list[str], staging: str, dsn: str) -> tuple[int, int]:
    import asyncpg

    conn = await asyncpg.connect(dsn)
    try:
        rates_rows = await conn.fetch("SELECT code, rate_to_eur FROM ref.fx_rates")
        rates = pa.table(
            {
                "code": pa.array([r[0] for r in rates_rows], pa.string()),
                "rate_to_eur": pa.array([r[1] for r in rates_rows], pa.decimal128(12, 6)),
            }
        )
        customers = await conn.prepare(_CUSTOMERS)
        rows = queries = 0
        columns = list(_NAMES)
        schema, table_name = staging.split(".")
        for path in files:
            for block in line_blocks(Path(path), header=True):
                table = _parse(block)
                if not table.num_rows:
                    continue
                keys = table.group_by(["tenant_id", "customer_id"]).aggregate([])
                found = await customers.fetchrow(
                    keys.column("tenant_id").to_pylist(), keys.column("customer_id").to_pylist()
                )
                queries += 1
                out = _enrich(table, found, rates)
                buffer = io.BytesIO()
                pacsv.write_csv(out, buffer, pacsv.WriteOptions(include_header=False))
                buffer.seek(0)
                await conn.copy_to_table(
                    table_name, source=buffer, schema_name=schema, columns=columns, format="csv"
                )
                rows += out.num_rows
        return rows, queries
    finally:
        await conn.close()


def orders_job(files: list[str], staging: str, dsn: str) -> tuple[int, int]:
    """Child process: read → look up → map → filter → COPY into ``staging``; (rows staged,
    customer queries). Blocks."""
    return asyncio.run(_run(files, staging, dsn))
