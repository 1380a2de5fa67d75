"""Real Iceberg and Delta tables for the maintenance tests: a PyIceberg ``SqlCatalog`` on the
test Postgres (warehouse in a tmp folder or an S3 bucket), a Delta table under a folder, each
filled by many small appends, and the oracle of what they hold — the rows appended,
computed here from the arguments, never read back from the table.

The content of a table is read by a second engine from the data files its current
snapshot/version names (DuckDB for local files, pyarrow for objects), so the tests compare
files on disk, not PyIceberg's or delta-rs's own view.
"""

from __future__ import annotations

import json
import secrets
from collections import Counter
from datetime import date
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import sqlalchemy as sa
from deltalake import DeltaTable, write_deltalake
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.table import Table
from pyiceberg.transforms import IdentityTransform
from pyiceberg.types import DateType, LongType, NestedField, StringType
from sqlalchemy.engine import make_url

__all__ = [
    "DAYS",
    "Row",
    "append_rows",
    "assert_same_rows",
    "batch",
    "delta_rows",
    "fill_delta",
    "iceberg_catalog",
    "iceberg_rows",
    "make_iceberg_table",
    "mark_published",
    "pg_engine",
    "record_transaction",
]

DAYS = (date(2026, 5, 1), date(2026, 5, 2))
Row = tuple[int, date, str]

_SCHEMA = Schema(
    NestedField(1, "id", LongType(), required=False),
    NestedField(2, "dt", DateType(), required=False),
    NestedField(3, "payload", StringType(), required=False),
)
_SPEC = PartitionSpec(
    PartitionField(source_id=2, field_id=1000, transform=IdentityTransform(), name="dt")
)


def pg_engine(db_url: str) -> sa.Engine:
    """An engine on the test database (what the maintenance functions lock with)."""
    url = make_url(db_url).set(drivername="postgresql+psycopg")
    return sa.create_engine(url, pool_size=2)


def iceberg_catalog(db_url: str, warehouse: str, **properties: str) -> SqlCatalog:
    """A SQL catalog on the test database (its ``iceberg_tables`` in ``public``)."""
    url = make_url(db_url).set(drivername="postgresql+psycopg")
    return SqlCatalog(
        "sluice",
        uri=url.render_as_string(hide_password=False),
        warehouse=warehouse,
        **properties,
    )


def batch(start: int, count: int, day: date) -> pa.Table:
    """``count`` rows ``id = start…``, of ``day``, with a payload derived from the id."""
    ids = list(range(start, start + count))
    return pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "dt": pa.array([day] * count, pa.date32()),
            "payload": [f"p{i * 7919 % 1000:03d}" for i in ids],
        }
    )


def rows_of(data: pa.Table) -> list[Row]:
    """The table's rows as (id, day, payload) tuples."""
    return list(zip(*(data.column(n).to_pylist() for n in ("id", "dt", "payload")), strict=True))


def make_iceberg_table(
    catalog: SqlCatalog, appends_per_day: int, per_append: int = 20
) -> tuple[Table, list[Row]]:
    """A new table (own namespace) partitioned by ``dt`` filled with ``appends_per_day``
    small appends per day of :data:`DAYS` (one file and one snapshot each); the oracle."""
    namespace = f"maint_{secrets.token_hex(4)}"
    catalog.create_namespace(namespace)
    table = catalog.create_table(f"{namespace}.events", schema=_SCHEMA, partition_spec=_SPEC)
    oracle: list[Row] = []
    for n in range(appends_per_day):
        for d, day in enumerate(DAYS):
            oracle += append_rows(table, (n * len(DAYS) + d) * per_append, per_append, day)
    return table, oracle


def append_rows(table: Table, start: int, count: int, day: date) -> list[Row]:
    """Append one small file of ``day``; the rows it adds (the oracle's part)."""
    data = batch(start, count, day)
    table.append(data)
    return rows_of(data)


def iceberg_rows(table: Table) -> tuple[list[Row], list[str]]:
    """The rows of the data files the current snapshot names (read by DuckDB, or pyarrow
    for object-store paths), and those paths."""
    table.refresh()
    paths = [task.file.file_path for task in table.scan().plan_files()]
    return _read_files(paths, table), paths


def _read_files(paths: list[str], table: Table | None = None) -> list[Row]:
    if not paths:
        return []
    if all("://" not in p or p.startswith("file://") for p in paths):
        local = [p.removeprefix("file://") for p in paths]
        found = duckdb.sql(
            "SELECT id, dt, payload FROM read_parquet($paths)", params={"paths": local}
        ).fetchall()
        return [(int(a), b, str(c)) for a, b, c in found]
    assert table is not None
    rows: list[Row] = []
    for path in paths:
        with table.io.new_input(path).open() as stream:
            rows += rows_of(pq.read_table(stream))
    return rows


def assert_same_rows(found: list[Row], oracle: list[Row]) -> None:
    """Exactly the oracle: duplicates = 0, missing = 0, nothing extra."""
    have, want = Counter(found), Counter(oracle)
    duplicates = sum(n - 1 for n in have.values() if n > 1)
    missing = sum((want - have).values())
    extra = sum((have - want).values())
    assert (duplicates, missing, extra) == (0, 0, 0), (duplicates, missing, extra)


def fill_delta(uri: str, appends_per_day: int, per_append: int = 20, **options: Any) -> list[Row]:
    """A Delta table at ``uri`` partitioned by ``dt`` (a string column, as Delta's
    partition values are) from many small appends; the oracle (with ``dt`` as a date)."""
    oracle: list[Row] = []
    for n in range(appends_per_day):
        for d, day in enumerate(DAYS):
            data = batch((n * len(DAYS) + d) * per_append, per_append, day)
            data = data.set_column(1, "dt", pa.array([day.isoformat()] * data.num_rows))
            write_deltalake(uri, data, partition_by=["dt"], mode="append", **options)
            oracle += rows_of(batch((n * len(DAYS) + d) * per_append, per_append, day))
    return oracle


def delta_rows(uri: str) -> tuple[list[Row], list[str]]:
    """The rows of the data files the table's current version names (DuckDB; ``dt`` from
    the partition value), and those paths."""
    table = DeltaTable(uri)
    paths = table.file_uris()
    found = duckdb.sql(
        "SELECT id, CAST(dt AS DATE), payload FROM read_parquet($paths, hive_partitioning=true)",
        params={"paths": [p.removeprefix("file://") for p in paths]},
    ).fetchall()
    return [(int(a), b, str(c)) for a, b, c in found], paths


def record_transaction(
    engine: sa.Engine, source: str, staged: list[dict[str, Any]], *, published: bool
) -> int:
    """A committed ``sink_transactions`` row naming ``staged`` files (what a lakehouse
    sink's checkpoint leaves: published, or waiting for its publish); its id."""
    with engine.begin() as conn:
        found = conn.execute(
            sa.text(
                "INSERT INTO sluice.sink_transactions (run_id, source, subtask, attempt, "
                "checkpoint_id, sink, staged, row_count, dead_letters, committed, published) "
                "VALUES (:run, :source, 0, 'a', 1, 'lake', CAST(:staged AS jsonb), 1, "
                "'[]'::jsonb, true, :published) RETURNING id"
            ),
            {
                "run": f"run-{secrets.token_hex(4)}",
                "source": source,
                "staged": json.dumps(staged),
                "published": published,
            },
        ).scalar_one()
    return int(found)


def mark_published(engine: sa.Engine, txn: int) -> None:
    with engine.begin() as conn:
        conn.execute(
            sa.text("UPDATE sluice.sink_transactions SET published = true WHERE id = :id"),
            {"id": txn},
        )
