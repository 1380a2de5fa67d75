"""The Iceberg sink's tests share: the demo pipeline writing an Iceberg table, the table
loaded back, and its content compared with the landing oracle by two engines (PyIceberg's
scan and DuckDB over the current snapshot's data files)."""

from __future__ import annotations

import dataclasses
from collections import Counter
from datetime import date
from typing import Any

import duckdb
import sqlalchemy as sa
from conftest import TestSettings
from demo_platform import demo_pipeline
from landing_oracle import expected_events
from sqlalchemy.engine import Engine

from enumerator_service import StorageOptions, connect_engine, database_url
from spark_jobs import IcebergSink, Pipeline
from spark_jobs.connectors.iceberg._catalog import open_catalog
from spark_jobs.connectors.iceberg._commit import CHECKPOINT_ID, RUN_ID


def table_name(settings: TestSettings) -> str:
    """A namespace per test (the session's database is shared, and a namespace keeps the
    warehouse location it was created with)."""
    return f"{settings.source_name}.enriched"


def iceberg_pipeline(settings: TestSettings, **sink: Any) -> Pipeline:
    """The clickstream demo pipeline of the test with its sink replaced by an Iceberg sink."""
    table = sink.pop("table", table_name(settings))
    return dataclasses.replace(demo_pipeline(settings), sink=IcebergSink(table, **sink))


def load(engine: Engine, settings: TestSettings, storage: StorageOptions | None = None) -> Any:
    return open_catalog(engine, None, storage).load_table(table_name(settings))


def current_files(table: Any) -> list[str]:
    return sorted(t.file.file_path for t in table.scan().plan_files())


def files_of_day(table: Any, day: date) -> set[str]:
    ordinal = (day - date(1970, 1, 1)).days
    return {t.file.file_path for t in table.scan().plan_files() if t.file.partition[0] == ordinal}


def duckdb_ids(table: Any, connection: Any = None) -> Counter[str]:
    """event_id counts read by DuckDB from the current snapshot's data files."""
    paths = [p.removeprefix("file://") for p in current_files(table)]
    if not paths:
        return Counter()
    con = connection or duckdb.connect()
    rows = con.sql(f"SELECT event_id FROM read_parquet({paths!r})").fetchall()
    return Counter(r[0] for r in rows)


def scan_ids(table: Any) -> Counter[str]:
    return Counter(table.scan(selected_fields=("event_id",)).to_arrow().column(0).to_pylist())


def oracle(settings: TestSettings, days: set[date] | None = None) -> Counter[str]:
    """event_id counts the landing files must produce (every valid event once)."""
    events, _ = expected_events(settings.landing_path)
    return Counter(e["event_id"] for e in events if days is None or e["event_time"].date() in days)


def differences(got: Counter[str], expected: Counter[str]) -> tuple[int, int, int]:
    """(duplicates, missing, unexpected) rows of ``got`` against ``expected``."""
    duplicates = sum(n - 1 for n in got.values() if n > 1)
    return duplicates, sum((expected - got).values()), sum((got - expected).values())


def assert_exact(table: Any, expected: Counter[str], connection: Any = None) -> None:
    found = differences(scan_ids(table), expected)
    assert found == (0, 0, 0), f"(duplicates, missing, unexpected) = {found} (PyIceberg scan)"
    found = differences(duckdb_ids(table, connection), expected)
    assert found == (0, 0, 0), f"(duplicates, missing, unexpected) = {found} (DuckDB)"


def checkpoints(table: Any) -> list[tuple[str, str]]:
    """(run, checkpoint id) of every snapshot a checkpoint committed, oldest first."""
    return [
        (s.summary[RUN_ID], s.summary[CHECKPOINT_ID])
        for s in table.snapshots()
        if s.summary is not None and s.summary.get(CHECKPOINT_ID) is not None
    ]


#: (revenue, orders, events) by user country.
Revenue = dict[str | None, tuple[float, int, int]]


def landing_revenue(settings: TestSettings, day: date) -> Revenue:
    """The oracle: the landing files' events of ``day`` (UTC event time), their users'
    countries from ``public.users`` (unknown users: None), aggregated in Python."""
    engine = connect_engine(database_url(settings, create=False), pool_size=1)
    try:
        with engine.connect() as conn:
            country = dict(conn.execute(sa.text("SELECT id, country FROM public.users")).all())
    finally:
        engine.dispose()
    totals: dict[str | None, list[float]] = {}
    for event in expected_events(settings.landing_path)[0]:
        if event["event_time"].date() != day:
            continue
        row = totals.setdefault(country.get(event["user_id"]), [0.0, 0, 0])
        if event["event_type"] == "order":
            row[0] += event["amount"]
            row[1] += 1
        row[2] += 1
    return {key: (value[0], int(value[1]), int(value[2])) for key, value in totals.items()}
