"""The Postgres table sink when its tables refuse writes (a trigger raises): a staged batch
table refusing a COPY fails the pre-commit with the database's reason and nothing of the
batch stays staged; the target refusing the commit rolls the whole completion back. Real
Postgres, the real checkpoint protocol, no Spark (the run-level cases are in
tests/faults/test_errors_sink.py)."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from sink_harness import ORDERS, Run, orders, refuse_batch_tables

from enumerator_service import asyncpg_dsn
from enumerator_service._operations import Platform, open_platform
from enumerator_service._schema import checkpoints
from spark_jobs.connectors.postgres import PostgresOptions
from spark_jobs.pipeline._plan import SinkPlan
from spark_jobs.sink import (
    TABLE_SINK_NAME,
    PostgresTableSinkWriter,
    batch_tables,
    ensure_tables,
    open_sink_writer,
    staged_rows,
)


@pytest.fixture
def platform(make_settings: Any) -> Iterator[Platform]:
    p = open_platform(make_settings())
    yield p
    p.close()


@pytest.fixture
def io() -> Iterator[ThreadPoolExecutor]:
    pool = ThreadPoolExecutor(1, thread_name_prefix="sink-writer")
    yield pool
    pool.shutdown()


_REFUSE = (
    "CREATE OR REPLACE FUNCTION sales.refuse() RETURNS trigger LANGUAGE plpgsql AS $$"
    " BEGIN RAISE EXCEPTION USING MESSAGE = 'writes refused into ' || TG_TABLE_NAME;"
    " END $$"
)


def _refuse_inserts(platform: Platform, table: str) -> None:
    with platform.engine.begin() as conn:
        conn.exec_driver_sql(_REFUSE)
        conn.exec_driver_sql(
            f"CREATE TRIGGER refuse BEFORE INSERT ON sales.{table}"
            " FOR EACH ROW EXECUTE FUNCTION sales.refuse()"
        )


@pytest.fixture
def refused_staging(platform: Platform) -> Iterator[None]:
    """Every staged batch table created in ``sales`` refuses its rows."""
    with platform.engine.begin() as conn:
        conn.exec_driver_sql("CREATE SCHEMA IF NOT EXISTS sales")
        conn.exec_driver_sql(_REFUSE)
        conn.exec_driver_sql(refuse_batch_tables("sales", "sales.refuse"))
    yield
    with platform.engine.begin() as conn:
        conn.exec_driver_sql("DROP EVENT TRIGGER refuse_batch_tables")


def _staged(platform: Platform, table: str) -> tuple[int, int]:
    """(batch tables, rows staged in them) of sink ``sales.<table>``."""
    with platform.engine.connect() as conn:
        return len(batch_tables(conn, "sales", table)), staged_rows(conn, "sales", table)


def _count(platform: Platform, table: str) -> int:
    with platform.engine.connect() as conn:
        return int(conn.exec_driver_sql(f"SELECT count(*) FROM sales.{table}").scalar_one())


def _writer(io: ThreadPoolExecutor, run: Run, table: str) -> PostgresTableSinkWriter:
    writer = open_sink_writer(
        SinkPlan("postgres", PostgresOptions(("sales", table))),
        io,
        schema=ORDERS,
        partitioned=False,
        dsn=asyncpg_dsn(run.platform.url),
        staging_root=Path("/nonexistent"),
        output_root=Path("/nonexistent"),
        run_id=run.run_id,
        subtask=0,
        attempt="a1",
    )
    assert isinstance(writer, PostgresTableSinkWriter)
    return writer


def test_a_staging_table_refusing_rows_fails_every_later_pre_commit_of_the_attempt(
    platform: Platform, io: ThreadPoolExecutor, refused_staging: None
) -> None:
    table = f"t_{secrets.token_hex(3)}"
    ensure_tables(platform.engine, "sales", table, ORDERS, partitioned=False, upsert_key=None)
    run = Run(platform, TABLE_SINK_NAME)
    writer = _writer(io, run, table)
    # More than one COPY: the first runs in the background before the pre-commit.
    writer.write_batch("", orders(*((i, "C", i, "1.00") for i in range(1, 10_001))))
    refused = f"staging rows into sales.{table} failed.*writes refused into __sluice_staged_"
    with pytest.raises(RuntimeError, match=refused):
        writer.pre_commit().result(timeout=30)
    # Rows after the refusal never commit either: the attempt's output is incomplete.
    writer.write_batch("", orders((10_001, "C", 1, "1.00")))
    with pytest.raises(RuntimeError, match="cannot commit"):
        writer.pre_commit().result(timeout=30)
    io.submit(writer.close).result(timeout=30)
    assert _staged(platform, table) == (0, 0)  # the batch table rolled back with its rows


def test_a_target_refusing_the_commit_rolls_the_completion_back(
    platform: Platform, io: ThreadPoolExecutor
) -> None:
    table = f"t_{secrets.token_hex(3)}"
    ensure_tables(platform.engine, "sales", table, ORDERS, partitioned=False, upsert_key=None)
    _refuse_inserts(platform, table)
    run = Run(platform, TABLE_SINK_NAME)
    writer = _writer(io, run, table)
    writer.write_batch("", orders((1, "C", 1, "1.00"), (2, "C", 2, "2.00")))
    out = writer.pre_commit().result(timeout=30)
    io.submit(writer.close).result(timeout=30)
    with pytest.raises(sa.exc.DBAPIError, match="writes refused into"):
        run.checkpoint(1, out)
    # Nothing committed past the refusal: the checkpoint is still pending, its rows staged.
    with platform.engine.connect() as conn:
        status = conn.execute(
            sa.select(checkpoints.c.status).where(checkpoints.c.run_id == run.run_id)
        ).scalar_one()
    assert (str(status), _count(platform, table)) == ("PENDING", 0)
    assert _staged(platform, table) == (1, 2)
