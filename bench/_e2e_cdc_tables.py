"""``bench/e2e.py``: the CDC rows' tables — the orders-like table, its changes, its pipelines
and the sink-equals-table check (``_e2e_cdc``, ``_e2e_cdc_latency``).

Threading: functions of the caller's thread; each blocks on Postgres.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from _e2e_common import USERS_TABLE

__all__ = [
    "APPLIED",
    "OUT",
    "STEP",
    "cdc_pipeline",
    "create_orders",
    "sink_diff",
    "write_changes",
]

STEP = 1_000  # changes per step: 600 inserts, 300 updates, 100 deletes (3 transactions)
COLUMNS = "id, user_id, status, qty"
OUT, APPLIED = "_out", "_applied"  # the sink tables of the lookup and the apply pipelines


def cdc_pipeline(
    name: str, table: str, rows_per_chunk: int, *, lookup: bool = True, url_env: str | None = None
) -> Any:
    """``table`` into ``<table>_out`` (upsert on id), through a lookup of the bench's users
    unless ``lookup`` is False (then into ``<table>_applied``: the change stream applied);
    ``url_env``: the table is in that database (see ``_e2e_cdc_source``)."""
    from spark_jobs import Lookup, Pipeline, PostgresCdcSource, PostgresSink

    steps = [
        Lookup(
            f"public.{USERS_TABLE}",
            on={"user_id": "id"},
            columns={"name": "user_name", "country": "user_country"},
            on_miss="keep",
        )
    ]
    return Pipeline(
        name=name,
        source=PostgresCdcSource(
            tables=[table],
            key="id",
            schema={"id": "int64", "user_id": "int64", "status": "string", "qty": "int64"},
            rows_per_chunk=rows_per_chunk,
            url_env=url_env,
        ),
        steps=steps if lookup else [],
        sink=PostgresSink(f"{table}{OUT if lookup else APPLIED}", upsert_key=["id"]),
    )


def create_orders(engine: sa.Engine, table: str, rows: int, users: int) -> None:
    """The table with ``rows`` rows (ids 1..rows, user ids spread over ``users``)."""
    with engine.begin() as conn:
        conn.execute(
            sa.text(
                f"CREATE TABLE {table} (id bigint PRIMARY KEY, user_id bigint, status text, "
                "qty bigint)"
            )
        )
        if rows:
            conn.execute(
                sa.text(
                    f"INSERT INTO {table} SELECT g, 1 + (g * 7919) % :users, 'new', g % 10 "
                    "FROM generate_series(1, :rows) g"
                ),
                {"rows": rows, "users": users},
            )


def write_changes(url: str, table: str, first_id: int, changes: int, users: int) -> int:
    """Commit about ``changes`` changes in steps of ``STEP`` (inserts of new ids from
    ``first_id``, updates of the previous step's inserts, deletes of the step before's);
    returns the changes committed (row counts of the statements)."""
    import psycopg

    per = STEP // 10
    done = 0
    with psycopg.connect(url, autocommit=True) as conn:
        for step in range(max(1, changes // STEP)):
            low = first_id + step * 6 * per
            cursors = [
                conn.execute(
                    f"INSERT INTO {table} SELECT g, 1 + (g * 7919) %% %s, 'new', g %% 10 "
                    "FROM generate_series(%s::bigint, %s::bigint) g",
                    (users, low, low + 6 * per - 1),
                ),
                # The previous step's inserts that the step before did not delete (3 per).
                conn.execute(
                    f"UPDATE {table} SET status = 'paid', qty = qty + 1 WHERE id BETWEEN %s AND %s",
                    (low - 6 * per + per, low - 6 * per + 4 * per - 1),
                ),
                conn.execute(
                    f"DELETE FROM {table} WHERE id BETWEEN %s AND %s",
                    (low - 12 * per, low - 12 * per + per - 1),
                ),
            ]
            done += sum(max(0, c.rowcount) for c in cursors)
    return done


def sink_diff(
    engine: sa.Engine, table: str, suffix: str = OUT, sink_engine: sa.Engine | None = None
) -> str:
    """'' when the sink table ``<table><suffix>`` (in ``sink_engine``'s database, default
    ``engine``'s) equals ``table`` (and, for the lookup's ``_out``, every row with a user
    was looked up), else what differs — both read here, independently of the pipeline."""
    looked_up = "user_name" if suffix == OUT else "''"
    with engine.connect() as conn:
        source = {r[0]: tuple(r) for r in conn.execute(sa.text(f"SELECT {COLUMNS} FROM {table}"))}
    with (sink_engine or engine).connect() as conn:
        rows = conn.execute(sa.text(f"SELECT {COLUMNS}, {looked_up} FROM {table}{suffix}")).all()
    sink: dict[int, tuple[Any, ...]] = {}
    duplicates = unlooked = 0
    for row in rows:
        duplicates += row[0] in sink
        unlooked += row[4] is None
        sink[row[0]] = tuple(row[:4])
    missing = len(source.keys() - sink.keys())
    extra = len(sink.keys() - source.keys())
    differing = sum(1 for k, v in source.items() if k in sink and sink[k] != v)
    if missing or extra or duplicates or differing or unlooked:
        return (
            f"missing {missing}, extra {extra}, duplicates {duplicates}, differing "
            f"{differing}, not looked up {unlooked} (of {len(source):,} rows)"
        )
    return ""
