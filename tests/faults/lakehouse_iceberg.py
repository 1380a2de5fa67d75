"""The Iceberg side of the lakehouse fault checks (``lakehouse_oracle`` has the Delta side):
the table read by PyIceberg's scan AND by DuckDB over the current snapshot's data files; the
``sluice.run-id`` / ``sluice.checkpoint-id`` of every snapshot in the metadata (not only the
current one's ancestors); the data files under the table's data folder that no snapshot's
manifests name (the sink's ``_sluice/`` field-id files are not data).

An Iceberg table has no ``dt`` column (its partition is ``day(<event time>)``): the reads get
``dt`` = the UTC day of the event time, the day the oracle files every record under.

Threading: plain functions of the test's thread.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.compute as pc
import sqlalchemy as sa
from lakehouse_oracle import Commits
from pyiceberg.table import Table

from spark_jobs.connectors.iceberg import remove_orphans
from spark_jobs.connectors.iceberg._catalog import open_catalog
from spark_jobs.connectors.iceberg._commit import CHECKPOINT_ID, RUN_ID

__all__ = [
    "iceberg_commits",
    "iceberg_reads",
    "iceberg_remove_orphans",
    "iceberg_table",
    "iceberg_unreferenced",
]

_KEEP = "_sluice"


def _engine(db_url: str) -> sa.Engine:
    return sa.create_engine(sa.make_url(db_url).set(drivername="postgresql+psycopg"))


def iceberg_table(db_url: str, identifier: str) -> Table:
    """``identifier`` in Sluice's catalog (in the platform database of ``db_url``)."""
    engine = _engine(db_url)
    try:
        return open_catalog(engine, None, None).load_table(identifier)
    finally:
        engine.dispose()


def _with_day(rows: pa.Table, event_time: str) -> pa.Table:
    if "dt" in rows.column_names:
        return rows
    return rows.append_column("dt", pc.cast(rows.column(event_time), pa.date32()))


def iceberg_reads(table: Table, event_time: str) -> dict[str, pa.Table]:
    by_scan = table.scan().to_arrow()
    paths = sorted(t.file.file_path.removeprefix("file://") for t in table.scan().plan_files())
    assert paths, f"{table.name()}: the current snapshot names no file"
    listed = ", ".join("'" + p.replace("'", "''") + "'" for p in paths)
    relation = duckdb.sql(f"SELECT * FROM read_parquet([{listed}])")
    assert relation is not None
    by_duckdb = relation.to_arrow_table()
    return {
        "pyiceberg": _with_day(by_scan, event_time),
        "duckdb": _with_day(by_duckdb, event_time),
    }


def iceberg_commits(table: Table, pipeline: str) -> Commits:
    """Every snapshot's (app id, checkpoint id) in the form of the Delta log walk: the app
    id ``sluice-<pipeline>-<run>`` (the Delta sink's), keyed by the snapshot's sequence."""
    txns: dict[int, list[tuple[str, int]]] = {}
    for n, snapshot in enumerate(sorted(table.snapshots(), key=lambda s: s.sequence_number or 0)):
        summary: Any = snapshot.summary
        run = summary.get(RUN_ID) if summary is not None else None
        found = txns.setdefault(n, [])
        if run is not None and summary.get(CHECKPOINT_ID) is not None:
            found.append((f"sluice-{pipeline}-{run}", int(summary.get(CHECKPOINT_ID))))
    return Commits(txns, set())


def _data_root(table: Table) -> Path:
    default = f"{table.location().rstrip('/')}/data"
    return Path(str(table.properties.get("write.data.path", default)).removeprefix("file://"))


def iceberg_unreferenced(table: Table) -> set[str]:
    """Data files under the data folder (not ``_sluice/``) no snapshot names (paths)."""
    table.refresh()
    root = _data_root(table)
    named = {
        p.removeprefix("file://") for p in table.inspect.all_files().column("file_path").to_pylist()
    }
    found = set()
    for path in root.rglob("*"):
        relative = path.relative_to(root).as_posix()
        if path.is_file() and _KEEP not in relative.split("/") and str(path) not in named:
            found.add(str(path))
    return found


def iceberg_remove_orphans(table: Table, db_url: str) -> Any:
    """The maintenance's orphan removal with grace 0 (its ``OrphanResult``)."""
    from datetime import timedelta

    engine = _engine(db_url)
    try:
        return remove_orphans(table, engine, timedelta(0))
    finally:
        engine.dispose()
