"""Both sinks with output schemas a pipeline derives (decimals, dates, booleans, int32,
mixed-case and reserved-word fields), staged and committed through the real checkpoint
protocol on a real Postgres: acknowledge, complete, abort, recovery sweep. No Spark.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import sqlalchemy as sa
from sink_harness import COLUMNS, DAY1, DAY2, ORDERS, Run, expected, orders

from enumerator_service import ConfigError, StagedTransaction, asyncpg_dsn
from enumerator_service._operations import Platform, open_platform
from spark_jobs.connectors.parquet import ParquetOptions
from spark_jobs.connectors.postgres import PostgresOptions
from spark_jobs.pipeline._plan import SinkPlan
from spark_jobs.sink import (
    SINK_NAME,
    TABLE_SINK_NAME,
    ParquetSinkWriter,
    PostgresTableSink,
    PostgresTableSinkWriter,
    ensure_tables,
    open_sink_writer,
    publish_files,
    staged_rows,
    sweep_staged,
)
from spark_jobs.sink._batch_tables import batch_table_name
from spark_jobs.sink._table_layout import TableLayout


@pytest.fixture
def platform(make_settings: Any) -> Iterator[Platform]:
    p = open_platform(make_settings())
    yield p
    p.close()


@pytest.fixture
def io() -> Iterator[ThreadPoolExecutor]:
    """The sink writer thread."""
    pool = ThreadPoolExecutor(1, thread_name_prefix="sink-writer")
    yield pool
    pool.shutdown()


# -- Parquet --------------------------------------------------------------------------------


def _parquet_writer(
    io: ThreadPoolExecutor, tmp_path: Path, run_id: str, **kw: Any
) -> ParquetSinkWriter:
    options: dict[str, Any] = {"dictionary": ["Customer"], "compression": "zstd", **kw}
    return ParquetSinkWriter(
        io,
        schema=ORDERS,
        staging_root=tmp_path / "staging",
        output_root=tmp_path / "out",
        run_id=run_id,
        subtask=0,
        attempt="a1",
        **options,
    )


def test_parquet_files_hold_exactly_the_rows_of_a_custom_schema(
    io: ThreadPoolExecutor, tmp_path: Path
) -> None:
    writer = _parquet_writer(io, tmp_path, "r1", compression="snappy")
    first = orders((1, "Ann", 10, "12.50"), (2, "Bob", 11, "0.01"), (3, "Ann", 12, "999.99"))
    second = orders((4, "Cy", 13, "1.00"))
    writer.write_batch(writer.output_partition(DAY1, None), first)
    writer.write_batch(writer.output_partition(DAY2, None), second)
    writer.write_batch(writer.output_partition(DAY1, None), orders((5, "Bob", 14, "-3.20")))
    writer.count_dropped(2)
    out = writer.pre_commit().result(timeout=30)
    assert (out.rows, out.dropped, len(out.files)) == (5, 2, 2)
    assert not (tmp_path / "out").exists()  # staged: nobody reads it yet
    publish_files(out.files)
    publish_files(out.files)  # idempotent
    day1 = sorted((tmp_path / "out" / "dt=2026-01-01").glob("*.parquet"))
    assert len(day1) == 1 and [e["rows"] for e in out.files] == [4, 1]
    table = pq.read_table(day1[0])
    assert table.schema == ORDERS
    last = (5, "Bob", 14, Decimal("-3.20"), False, datetime(2026, 1, 1, 12, 5, tzinfo=UTC), DAY1)
    assert [tuple(r.values()) for r in table.to_pylist()] == [*expected(first), last]
    column = pq.ParquetFile(day1[0]).metadata.row_group(0).column
    assert "RLE_DICTIONARY" in column(1).encodings  # Customer: dictionary
    assert "RLE_DICTIONARY" not in column(0).encodings  # order_id: plain
    assert column(0).compression == "SNAPPY"
    with pytest.raises(ValueError, match="a batch has"):
        writer.write_batch("", first.drop_columns(["paid"]))


def test_unpartitioned_parquet_output_lands_in_the_root_through_the_checkpoint(
    platform: Platform, io: ThreadPoolExecutor, tmp_path: Path
) -> None:
    run = Run(platform, SINK_NAME)
    plan = SinkPlan("parquet", ParquetOptions("orders", ("Customer",)))
    writer = open_sink_writer(
        plan,
        io,
        schema=ORDERS,
        partitioned=False,
        dsn="",
        staging_root=tmp_path / "staging",
        output_root=tmp_path / "out",
        run_id=run.run_id,
        subtask=0,
        attempt="a1",
    )
    assert isinstance(writer, ParquetSinkWriter)
    partition = writer.output_partition(None, None)
    batch = orders((1, "Ann", 1, "1.10"), (2, "Bob", 2, "2.20"))
    writer.write_batch(partition, batch)
    writer.count_dropped(7)
    run.checkpoint(1, writer.pre_commit().result(timeout=30))
    files = list((tmp_path / "out").iterdir())
    assert [f.parent for f in files] == [tmp_path / "out"]
    assert expected(pq.read_table(files[0]).to_batches()[0]) == expected(batch)
    assert run.dropped() == [7]
    with pytest.raises(ValueError, match="unpartitioned"):
        writer.output_partition(None, 3)


# -- Postgres table -------------------------------------------------------------------------


def _table_writer(
    io: ThreadPoolExecutor, run: Run, table: str, *, upsert_key: list[str] | None = None, **kw: Any
) -> PostgresTableSinkWriter:
    plan = SinkPlan(
        "postgres",
        PostgresOptions(("sales", table)),
        upsert_key=None if upsert_key is None else tuple(upsert_key),
    )
    writer = open_sink_writer(
        plan,
        io,
        schema=kw.pop("schema", ORDERS),
        partitioned=kw.pop("partitioned", False),
        dsn=asyncpg_dsn(run.platform.url),
        staging_root=Path("/nonexistent"),
        output_root=Path("/nonexistent"),
        run_id=run.run_id,
        subtask=0,
        attempt="a1",
    )
    assert isinstance(writer, PostgresTableSinkWriter)
    return writer


def _select(platform: Platform, query: str) -> list[tuple[Any, ...]]:
    with platform.engine.connect() as conn:
        return [tuple(r) for r in conn.execute(sa.text(query)).all()]


def _staged_count(platform: Platform, table: str) -> int:
    with platform.engine.connect() as conn:
        return staged_rows(conn, "sales", table)


def test_append_rows_commit_with_their_checkpoint(
    platform: Platform, io: ThreadPoolExecutor
) -> None:
    table = f"t_{secrets.token_hex(3)}"
    ensure_tables(platform.engine, "sales", table, ORDERS, partitioned=True, upsert_key=None)
    run = Run(platform, TABLE_SINK_NAME)
    writer = _table_writer(io, run, table, partitioned=True)
    first = orders(*((i, f"C{i % 3}", i, f"{i}.25") for i in range(1, 10_001)))  # > one COPY
    second = orders((10_001, "Zed", 0, "0.00"))
    writer.write_batch(writer.output_partition(DAY1, None), first)
    writer.write_batch(writer.output_partition(DAY2, None), second)
    writer.count_dropped(4)
    writer.dead_letter(run.held.split_id, 17, b"{oops", "malformed")
    out = writer.pre_commit().result(timeout=30)
    assert out.files == [
        {
            "schema": "sales",
            "table": table,
            "columns": ORDERS.names,
            "partitioned": True,
            "upsert_key": None,
            "run_id": run.run_id,
            "subtask": 0,
            "attempt": "a1",
            "batch": 1,
            "staged_table": batch_table_name(
                TableLayout.build("sales", table, ORDERS.names, partitioned=True, upsert_key=None),
                (run.run_id, 0, "a1", 1),
            ),
            "rows": 10_001,
            "rows_by_partition": {"2026-01-01": 10_000, "2026-01-02": 1},
        }
    ]
    assert _select(platform, f"SELECT count(*) FROM sales.{table}") == [(0,)]  # invisible
    assert _staged_count(platform, table) == 10_001
    run.checkpoint(1, out)
    rows = _select(platform, f"SELECT {COLUMNS}, dt FROM sales.{table} ORDER BY order_id")
    assert rows == [(*r, DAY1) for r in expected(first)] + [(*expected(second)[0], DAY2)]
    assert _staged_count(platform, table) == 0
    assert run.dropped() == [4]
    # The next batch of the same writer appends (no key: the same values again are new rows).
    writer.write_batch("2026-01-01", second)
    out = writer.pre_commit().result(timeout=30)
    assert out.files[0]["batch"] == 2
    run.checkpoint(2, out)
    assert _select(platform, f"SELECT count(*) FROM sales.{table}") == [(10_002,)]
    io.submit(writer.close).result(timeout=30)
    with pytest.raises(ValueError, match="day-partitioned"):
        writer.output_partition(None, None)


def test_upsert_keeps_one_row_per_key_with_the_latest_values(
    platform: Platform, io: ThreadPoolExecutor
) -> None:
    table = f"t_{secrets.token_hex(3)}"
    key = ["Customer", "order"]  # mixed case and a reserved word
    ensure_tables(platform.engine, "sales", table, ORDERS, partitioned=False, upsert_key=key)
    ensure_tables(platform.engine, "sales", table, ORDERS, partitioned=False, upsert_key=key)
    run = Run(platform, TABLE_SINK_NAME)
    writer = _table_writer(io, run, table, upsert_key=key)
    # Checkpoint 1: a key twice in one batch, and again in a later batch of the same commit.
    writer.write_batch(
        "", orders((0, "Ann", 1, "0.50"), (1, "Ann", 1, "1.00"), (2, "Bob", 1, "2.00"))
    )
    writer.write_batch("", orders((3, "Ann", 1, "3.00"), (4, "Cy", 7, "4.00")))
    writer.write_batch("", orders((5, "Bob", 1, "5.00")))
    run.checkpoint(1, writer.pre_commit().result(timeout=30))
    query = f'SELECT "Customer", "order", order_id, total FROM sales.{table} ORDER BY 1, 2'
    assert _select(platform, query) == [
        ("Ann", 1, 3, Decimal("3.00")),
        ("Bob", 1, 5, Decimal("5.00")),
        ("Cy", 7, 4, Decimal("4.00")),
    ]
    # Checkpoint 2 aborts: its batch rolls into checkpoint 3 with a later batch; the later
    # batch's row of a key wins over the earlier batch's.
    writer.write_batch("", orders((6, "Ann", 1, "6.00"), (7, "Dee", 2, "7.00")))
    run.checkpoint(2, writer.pre_commit().result(timeout=30), complete=False)
    writer.write_batch("", orders((8, "Ann", 1, "8.00"), (9, "Cy", 7, "9.00")))
    run.checkpoint(3, writer.pre_commit().result(timeout=30))
    assert _select(platform, query) == [
        ("Ann", 1, 8, Decimal("8.00")),
        ("Bob", 1, 5, Decimal("5.00")),
        ("Cy", 7, 9, Decimal("9.00")),
        ("Dee", 2, 7, Decimal("7.00")),
    ]
    # AT_LEAST_ONCE: the acknowledgement itself upserts.
    writer.write_batch("", orders((10, "Dee", 2, "10.00")))
    run.checkpoints.trigger(4)
    run.ack(4, writer.pre_commit().result(timeout=30), two_phase=False)
    assert _select(platform, query)[3] == ("Dee", 2, 10, Decimal("10.00"))
    assert _staged_count(platform, table) == 0
    nulls = pa.array([None], pa.int32())
    no_key = orders((11, "Eve", 0, "1.00")).set_column(2, "order", nulls)
    with pytest.raises(ValueError, match="upsert_key field 'order' is null in 1 record"):
        writer.write_batch("", no_key)
    io.submit(writer.close).result(timeout=30)


def test_ensure_tables_rejects_unusable_targets_in_one_line(platform: Platform) -> None:
    with platform.engine.begin() as conn:
        conn.execute(sa.text("CREATE SCHEMA IF NOT EXISTS sales"))
        conn.execute(sa.text('CREATE TABLE sales.narrow (order_id bigint, "Customer" text)'))
        conn.execute(sa.text(f"CREATE TABLE sales.wide ({COLUMNS.replace(',', ' text,')} text)"))
    with pytest.raises(ConfigError) as missing:
        ensure_tables(
            platform.engine, "sales", "narrow", ORDERS, partitioned=False, upsert_key=None
        )
    assert str(missing.value) == (
        "sink sales.narrow: sales.narrow exists without column(s) order, total, paid,"
        ' placed_at, day; add them (ALTER TABLE "sales"."narrow" ADD COLUMN "order" integer,'
        ' ADD COLUMN "total" numeric(12,2), ADD COLUMN "paid" boolean, ADD COLUMN'
        ' "placed_at" timestamptz, ADD COLUMN "day" date) or drop the table'
    )
    key = ["order_id"]
    with pytest.raises(ConfigError, match=r"^sink sales.wide: .* no unique index .*\(order_id\)"):
        ensure_tables(platform.engine, "sales", "wide", ORDERS, partitioned=False, upsert_key=key)
    with platform.engine.begin() as conn:  # a unique index on more columns is no arbiter
        conn.execute(sa.text('CREATE UNIQUE INDEX ON sales.wide (order_id, "order")'))
    with pytest.raises(ConfigError, match="no unique index"):
        ensure_tables(platform.engine, "sales", "wide", ORDERS, partitioned=False, upsert_key=key)
    with platform.engine.begin() as conn:
        conn.execute(sa.text("ALTER TABLE sales.wide ADD UNIQUE (order_id)"))
    ensure_tables(platform.engine, "sales", "wide", ORDERS, partitioned=False, upsert_key=key)
    with platform.engine.begin() as conn:
        conn.execute(sa.text("ALTER TABLE sales.wide ADD note text NOT NULL"))
    with pytest.raises(ConfigError, match=r"NOT NULL column.* without a default .*: note$"):
        ensure_tables(platform.engine, "sales", "wide", ORDERS, partitioned=False, upsert_key=key)
    with platform.engine.begin() as conn:
        conn.execute(sa.text("ALTER TABLE sales.wide ALTER note SET DEFAULT ''"))
    ensure_tables(platform.engine, "sales", "wide", ORDERS, partitioned=False, upsert_key=key)
    bad = ORDERS.append(pa.field("bad name", pa.int64()))
    with pytest.raises(ConfigError, match=r"^sink sales.wide: column 'bad name'"):
        ensure_tables(platform.engine, "sales", "wide", bad, partitioned=False, upsert_key=None)
    assert "\n" not in str(missing.value)


def test_aborted_and_orphaned_staged_rows_are_removed(
    platform: Platform, io: ThreadPoolExecutor
) -> None:
    table = f"t_{secrets.token_hex(3)}"
    ensure_tables(platform.engine, "sales", table, ORDERS, partitioned=False, upsert_key=None)
    run = Run(platform, TABLE_SINK_NAME)
    writer = _table_writer(io, run, table)
    writer.write_batch("", orders((1, "Ann", 1, "1.00"), (2, "Bob", 2, "2.00")))
    acked = writer.pre_commit().result(timeout=30)
    run.checkpoints.trigger(1)
    run.ack(1, acked)
    writer.write_batch("", orders((3, "Cy", 3, "3.00")))
    orphan = writer.pre_commit().result(timeout=30)  # the task dies before acknowledging
    # The third batch is open (one chunk COPYed, uncommitted) when the task fails.
    writer.write_batch("", orders(*((i, "Dee", i, "4.00") for i in range(9000))))
    io.submit(lambda: None).result(timeout=30)
    assert writer.rows_written == 3 + 9000
    assert _staged_count(platform, table) == 3
    io.submit(writer.abort).result(timeout=30)
    assert (acked.rows, orphan.rows, _staged_count(platform, table)) == (2, 1, 3)

    # The run ends: its acknowledged batch is aborted; the orphan is swept once the run
    # holds no split.
    assert run.checkpoints.abort_uncommitted() == 1
    assert _staged_count(platform, table) == 1
    assert sweep_staged(platform.engine, "sales", table) == 0  # the run still holds its split
    run.store.release_run(run.run_id)
    assert sweep_staged(platform.engine, "sales", table) == 1
    assert _select(platform, f"SELECT count(*) FROM sales.{table}") == [(0,)]
    txn = StagedTransaction(0, run.run_id, 0, "a1", 1, TABLE_SINK_NAME, acked.files, 2)
    PostgresTableSink(platform.engine).abort([txn])  # idempotent


def test_staged_entries_are_validated_again_and_each_batch_has_its_layout(
    platform: Platform, io: ThreadPoolExecutor
) -> None:
    table = f"t_{secrets.token_hex(3)}"
    ensure_tables(platform.engine, "sales", table, ORDERS, partitioned=False, upsert_key=None)
    run = Run(platform, TABLE_SINK_NAME)
    writer = _table_writer(io, run, table)
    writer.write_batch("", orders((1, "Ann", 1, "1.00")))
    out = writer.pre_commit().result(timeout=30)
    io.submit(writer.close).result(timeout=30)
    sink = PostgresTableSink(platform.engine)
    for tampered in (
        {"columns": ['x" text); DROP TABLE t; --']},
        {"table": "a;b"},
        {"staged_table": 'x"; DROP TABLE t; --'},
        {"staged_table": f"{out.files[0]['staged_table']}x"},
        {"staged_table": None},
    ):
        entry = {**out.files[0], **tampered}
        txn = StagedTransaction(0, run.run_id, 0, "a1", 1, TABLE_SINK_NAME, [entry], 1)
        with pytest.raises((ValueError, ConfigError)), platform.engine.begin() as conn:
            sink.commit(conn, [txn])
    # The output changes (total gets a wider type) while a live run has a batch staged: a
    # batch table has the layout of its own batch, so both commit.
    wider = ORDERS.set(3, pa.field("total", pa.decimal128(14, 2)))
    ensure_tables(platform.engine, "sales", table, wider, partitioned=False, upsert_key=None)
    again = Run(platform, TABLE_SINK_NAME)
    writer = _table_writer(io, again, table, schema=wider)
    writer.write_batch("", orders((2, "Bob", 2, "2.50"), schema=wider))
    again.checkpoint(1, writer.pre_commit().result(timeout=30))
    run.checkpoint(1, out)
    io.submit(writer.close).result(timeout=30)
    assert _select(platform, f"SELECT order_id, total FROM sales.{table} ORDER BY 1") == [
        (1, Decimal("1.00")),
        (2, Decimal("2.50")),
    ]
    assert _staged_count(platform, table) == 0


def test_every_supported_type_round_trips_through_the_table(
    platform: Platform, io: ThreadPoolExecutor
) -> None:
    kinds = {
        "i8": pa.int8(),
        "i16": pa.int16(),
        "i32": pa.int32(),
        "i64": pa.int64(),
        "f32": pa.float32(),
        "f64": pa.float64(),
        "b": pa.bool_(),
        "s": pa.string(),
        "raw": pa.binary(),
        "d": pa.date32(),
        "ts": pa.timestamp("us", tz="UTC"),
        "naive": pa.timestamp("us"),
        "big": pa.decimal128(38, 10),
    }
    schema = pa.schema(list(kinds.items()))
    values = [
        -5, -300, 70_000, 2**40, 1.5, 2.25, True, "ü", b"\x00\xff", DAY2,
        datetime(2026, 1, 2, 3, 4, 5, 6, tzinfo=UTC), datetime(2026, 1, 2, 3, 4, 5),
        Decimal("1234567890123456789012345678.0123456789"),
    ]  # fmt: skip
    batch = pa.RecordBatch.from_pylist(
        [dict(zip(kinds, values, strict=True)), dict.fromkeys(kinds)], schema=schema
    )
    table = f"t_{secrets.token_hex(3)}"
    ensure_tables(platform.engine, "sales", table, schema, partitioned=False, upsert_key=None)
    run = Run(platform, TABLE_SINK_NAME)
    writer = _table_writer(io, run, table, schema=schema)
    writer.write_batch("", batch)
    run.checkpoint(1, writer.pre_commit().result(timeout=30))
    io.submit(writer.close).result(timeout=30)
    rows = _select(platform, f"SELECT {', '.join(kinds)} FROM sales.{table} ORDER BY i8")
    assert [tuple(bytes(v) if isinstance(v, memoryview) else v for v in r) for r in rows] == [
        tuple(values),
        (None,) * len(kinds),
    ]


def test_a_batch_staged_before_batch_tables_commits_and_the_shared_table_goes(
    platform: Platform, io: ThreadPoolExecutor
) -> None:
    """An upgrade with a batch pre-committed by a version that staged into one shared
    ``<table>__staged`` (staging key columns in every row): the entry without a batch table
    still commits from there; the sweep deletes dead runs' rows and drops the emptied table."""
    table = f"t_{secrets.token_hex(3)}"
    ensure_tables(
        platform.engine, "sales", table, ORDERS, partitioned=False, upsert_key=["order_id"]
    )
    run = Run(platform, TABLE_SINK_NAME)
    writer = _table_writer(io, run, table, upsert_key=["order_id"])
    writer.write_batch("", orders((1, "Ann", 1, "1.00"), (2, "Bob", 2, "2.00")))
    out = writer.pre_commit().result(timeout=30)
    io.submit(writer.close).result(timeout=30)
    batch_table = out.files[0].pop("staged_table")  # the entry as the old version wrote it
    with platform.engine.begin() as conn:
        conn.exec_driver_sql(
            f'CREATE TABLE sales."{table}__staged" AS SELECT CAST(%(run)s AS text)'
            ' AS "__sluice_run_id", 0 AS "__sluice_subtask", CAST(%(attempt)s AS text)'
            ' AS "__sluice_attempt", CAST(1 AS bigint) AS "__sluice_batch", *'
            f' FROM sales."{batch_table}"',
            {"run": run.run_id, "attempt": "a1"},
        )
        conn.exec_driver_sql(f'DROP TABLE sales."{batch_table}"')
        conn.exec_driver_sql(  # a row of a run that died long ago
            f"INSERT INTO sales.\"{table}__staged\" SELECT 'gone', 0, 'a1', 1, 1, 9"
        )
    run.checkpoint(1, out)
    got = _select(platform, f'SELECT order_id, "Customer" FROM sales.{table} ORDER BY 1')
    assert got == [(1, "Ann"), (2, "Bob")]
    assert _select(platform, f'SELECT count(*) FROM sales."{table}__staged"') == [(1,)]
    assert sweep_staged(platform.engine, "sales", table) == 1
    exists = _select(platform, f"SELECT to_regclass('sales.\"{table}__staged\"')")
    assert exists == [(None,)]
    assert sweep_staged(platform.engine, "sales", table) == 0
