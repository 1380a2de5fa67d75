"""What a lakehouse table holds after the fault runs, read without Sluice's code: the Delta
table through delta-rs AND through DuckDB over the files its log's current version names;
the app transactions of every commit, walked in ``_delta_log`` (not delta-rs' view of it);
the data files under the table that no log entry names (orphans).

The comparison with the oracle reuses ``fault_harness.verify`` (clickstream: a read is
written out as a Hive-partitioned Parquet folder, which ``verify`` reads) and
``orders_oracle.verify_orders`` (orders: a read is loaded into a table of the test's
database, which ``verify_orders`` joins with the landed orders).

The Iceberg sink gets its own ``read_*``/``commits`` here when it lands (see the hook in
``test_lakehouse_faults.py``).
"""

from __future__ import annotations

import json
import shutil
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import sqlalchemy as sa
from deltalake import DeltaTable

__all__ = [
    "Commits",
    "delta_commits",
    "delta_reads",
    "load_into_postgres",
    "pending_paths",
    "published_checkpoints",
    "to_folder",
    "unreferenced_files",
]

_LOG = "_delta_log"


def delta_reads(table: Path) -> dict[str, pa.Table]:
    """The table's current rows as delta-rs reads them and as DuckDB reads the Parquet files
    the log's current version names (partition values from their ``dt=D`` folders)."""
    delta = DeltaTable(str(table))
    by_delta = delta.to_pyarrow_table()
    files = [uri.removeprefix("file://") for uri in delta.file_uris()]
    assert files, f"{table}: the current version names no file"
    listed = ", ".join("'" + f.replace("'", "''") + "'" for f in files)
    relation = duckdb.sql(f"SELECT * FROM read_parquet([{listed}], hive_partitioning = true)")
    assert relation is not None
    by_duckdb = relation.to_arrow_table()
    return {"delta-rs": by_delta, "duckdb": by_duckdb}


def to_folder(rows: pa.Table, folder: Path) -> Path:
    """``rows`` as a Hive-partitioned Parquet folder (by ``dt``) for ``fault_harness.verify``."""
    shutil.rmtree(folder, ignore_errors=True)
    rows = rows.set_column(
        rows.schema.get_field_index("dt"), "dt", rows.column("dt").cast(pa.string())
    )
    pq.write_to_dataset(rows, folder, partition_cols=["dt"])
    return folder


_ORDERS_COLUMNS = {
    "order_id": "text",
    "tenant_id": "bigint",
    "customer_id": "bigint",
    "currency": "text",
    "amount": "numeric",
    "ordered_at": "timestamptz",
    "customer_name": "text",
    "segment": "text",
    "rate_to_eur": "numeric",
    "amount_eur": "numeric",
    "dt": "date",
}


def load_into_postgres(db_url: str, rows: pa.Table, table: str) -> int:
    """``rows`` (an orders read) into a fresh ``lake_read.<table>`` for ``verify_orders``;
    returns how many order ids it holds more than once."""
    engine = sa.create_engine(sa.make_url(db_url).set(drivername="postgresql+psycopg"))
    columns = ", ".join(f"{name} {kind}" for name, kind in _ORDERS_COLUMNS.items())
    try:
        with engine.begin() as conn:
            conn.execute(sa.text("CREATE SCHEMA IF NOT EXISTS lake_read"))
            conn.execute(sa.text(f"DROP TABLE IF EXISTS lake_read.{table}"))
            conn.execute(sa.text(f"CREATE TABLE lake_read.{table} ({columns})"))
            raw: Any = conn.connection.driver_connection
            names = list(_ORDERS_COLUMNS)
            with (
                raw.cursor() as cursor,
                cursor.copy(f"COPY lake_read.{table} ({', '.join(names)}) FROM STDIN") as copy,
            ):
                for row in rows.select(names).to_pylist():
                    copy.write_row([row[n] for n in names])
    finally:
        engine.dispose()
    ids = Counter(rows.column("order_id").to_pylist())
    return sum(n - 1 for n in ids.values() if n > 1)


@dataclass(frozen=True)
class Commits:
    """The log walked: per log version, its app transactions ``(app id, version)``; the
    data files any add or remove names (paths relative to the table)."""

    txns: dict[int, list[tuple[str, int]]]
    named: set[str]

    def versions_by_app(self) -> dict[str, list[int]]:
        found: dict[str, list[int]] = {}
        for log_version in sorted(self.txns):
            for app, version in self.txns[log_version]:
                found.setdefault(app, []).append(version)
        return found

    def once(self) -> list[tuple[str, int, int]]:
        """(app id, version, times) of every app transaction version committed twice+."""
        seen = Counter(txn for txns in self.txns.values() for txn in txns)
        return [(app, v, n) for (app, v), n in seen.items() if n > 1]


def delta_commits(table: Path) -> Commits:
    log = table / _LOG
    checkpoints = list(log.glob("*.checkpoint*.parquet"))
    assert not checkpoints, f"a log checkpoint hides commits this walk needs: {checkpoints}"
    txns: dict[int, list[tuple[str, int]]] = {}
    named: set[str] = set()
    for path in sorted(log.glob("*.json")):
        if not path.name.split(".")[0].isdigit():
            continue
        found = txns.setdefault(int(path.name.split(".")[0]), [])
        for line in path.read_text().splitlines():
            action = json.loads(line) if line.strip() else {}
            if "txn" in action:
                found.append((action["txn"]["appId"], int(action["txn"]["version"])))
            for kind in ("add", "remove"):
                if kind in action:
                    named.add(unquote(action[kind]["path"]))
    return Commits(txns, named)


def unreferenced_files(table: Path, commits: Commits) -> set[str]:
    """Data files under the table that no log entry names (hidden ``_``/``.`` paths — the
    log — excluded), relative to the table."""
    found = set()
    for path in table.rglob("*"):
        relative = path.relative_to(table).as_posix()
        if path.is_file() and not any(p.startswith(("_", ".")) for p in relative.split("/")):
            found.add(relative)
    return found - commits.named


def published_checkpoints(db_url: str, source: str) -> dict[str, dict[str, Any]]:
    """Per run: the checkpoint ids of its committed sink transactions that have files, and
    how many of its transactions are committed but not published."""
    engine = sa.create_engine(sa.make_url(db_url).set(drivername="postgresql+psycopg"))
    try:
        with engine.connect() as conn:
            rows = conn.execute(
                sa.text(
                    "SELECT run_id, checkpoint_id, committed, published,"
                    " jsonb_array_length(staged) > 0 AS has_files"
                    " FROM sluice.sink_transactions WHERE source = :s"
                ),
                {"s": source},
            ).all()
    finally:
        engine.dispose()
    runs: dict[str, dict[str, Any]] = {}
    for run_id, checkpoint, committed, published, has_files in rows:
        run = runs.setdefault(run_id, {"checkpoints": set(), "unpublished": 0})
        if committed and has_files:
            run["checkpoints"].add(int(checkpoint))
        if committed and not published:
            run["unpublished"] += 1
    return runs


def pending_paths(db_url: str, source: str) -> set[str]:
    """The data files (absolute local paths) of ``source``'s sink transactions that are not
    committed-and-published: a recovery still has to commit (or abort) them."""
    engine = sa.create_engine(sa.make_url(db_url).set(drivername="postgresql+psycopg"))
    try:
        with engine.connect() as conn:
            staged = conn.execute(
                sa.text(
                    "SELECT staged FROM sluice.sink_transactions"
                    " WHERE source = :s AND NOT (committed AND published)"
                ),
                {"s": source},
            ).scalars()
            return {
                str(entry[key]).removeprefix("file://")
                for entries in staged
                for entry in entries
                for key in ("staged", "final")
                if key in entry
            }
    finally:
        engine.dispose()
