"""The Postgres table sink's staging COPY paths, same rows, same invocation: binary COPY row
by row (``write_row``, the baseline), CSV COPY rendered by Arrow, and binary COPY built
column-wise (``_copy_binary``).

    python bench/table_sink.py [--rows 200000] [--rounds 3]

Two shapes of ``--rows`` rows each, through ``PostgresTableSinkWriter`` in batches of 5,000,
one pre-commit at the end, on the platform database of ``load_settings()``:

- **orders** (the orders example's output: strings, integers, decimals, a UTC timestamp;
  day-partitioned): row by row against CSV (a decimal keeps the column-wise path off);
- **changes** (a CDC source's change stream: integers, short strings, the LSN, the commit
  time, a NULL before-image, the table name): all three paths.

Each path runs once unmeasured, then ``--rounds`` interleaved rounds; prints each path's
median and the ratios. Measures the writer thread end to end (rendering, COPY, commit; wall,
with the server's parsing), the CPU seconds of this process (what a Spark task pays) and of
the COPY's server process (what the database pays), not a run. The staged rows are deleted
afterwards.
"""

from __future__ import annotations

import argparse
import os
import secrets
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pyarrow as pa
import sqlalchemy as sa

from enumerator_service import asyncpg_dsn, load_settings
from enumerator_service._operations import Platform, open_platform
from spark_jobs.sink import PostgresTableSinkWriter, ensure_tables

ORDERS = pa.schema(
    [
        ("order_id", pa.string()),
        ("tenant_id", pa.int64()),
        ("customer_id", pa.int64()),
        ("currency", pa.string()),
        ("amount", pa.decimal128(12, 2)),
        ("ordered_at", pa.timestamp("us", tz="UTC")),
        ("customer_name", pa.string()),
        ("segment", pa.string()),
        ("rate_to_eur", pa.decimal128(12, 6)),
        ("amount_eur", pa.decimal128(18, 2)),
    ]
)
CHANGES = pa.schema(
    [
        ("id", pa.int64()),
        ("user_id", pa.int64()),
        ("status", pa.string()),
        ("qty", pa.int64()),
        ("_op", pa.string()),
        ("_lsn", pa.int64()),
        ("_commit_time", pa.timestamp("us", tz="UTC")),
        ("_before", pa.string()),
        ("_table", pa.string()),
    ]
)
TABLE = "bench_table_sink"
PATHS = {
    "binary COPY (row by row)": "rows",
    "CSV COPY (Arrow)": "csv",
    "binary COPY (columns)": "columns",
}


def orders(start: int, rows: int) -> pa.RecordBatch:
    base = datetime(2026, 1, 1, tzinfo=UTC)
    ids = range(start, start + rows)
    return pa.RecordBatch.from_arrays(
        [
            pa.array([f"o-{i:09d}" for i in ids]),
            pa.array([i % 5 for i in ids], pa.int64()),
            pa.array([i % 100_000 for i in ids], pa.int64()),
            pa.array([("EUR", "USD", "GBP")[i % 3] for i in ids]),
            pa.array([Decimal(i % 100_000) / 100 for i in ids], pa.decimal128(12, 2)),
            pa.array([base + timedelta(seconds=i) for i in ids], pa.timestamp("us", tz="UTC")),
            pa.array([None if i % 7 == 0 else f"Customer {i % 100_000}" for i in ids]),
            pa.array([("retail", "smb", "enterprise")[i % 3] for i in ids]),
            pa.array([Decimal(10 + i % 3) / 10 for i in ids], pa.decimal128(12, 6)),
            pa.array([Decimal(i % 100_000) / 100 for i in ids], pa.decimal128(18, 2)),
        ],
        schema=ORDERS,
    )


def changes(start: int, rows: int) -> pa.RecordBatch:
    base = datetime(2026, 1, 1, tzinfo=UTC)
    ids = range(start, start + rows)
    return pa.RecordBatch.from_arrays(
        [
            pa.array(list(ids), pa.int64()),
            pa.array([i * 7 % 1_000_000 for i in ids], pa.int64()),
            pa.array([("new", "paid", "shipped")[i % 3] for i in ids]),
            pa.array([i % 10 for i in ids], pa.int64()),
            pa.array([("c", "u", "d")[i % 3] for i in ids]),
            pa.array([40_000_000 + i * 120 for i in ids], pa.int64()),
            pa.array([base + timedelta(microseconds=i * 37) for i in ids], CHANGES[6].type),
            pa.array([None] * rows, pa.string()),
            pa.array(["public.bench_cdc_0b7095f1"] * rows),
        ],
        schema=CHANGES,
    )


def _backend_cpu(pid: int) -> float:
    """CPU seconds of server process ``pid`` since it started."""
    with open(f"/proc/{pid}/stat") as f:
        stat = f.read()
    fields = stat[stat.rfind(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def stage(
    platform: Platform, schema: pa.Schema, batches: list[pa.RecordBatch], *, via: str
) -> tuple[float, float, float]:
    """(Wall seconds, this process' CPU seconds, the server's CPU seconds) to stage and
    pre-commit ``batches``; the staged batch tables are dropped after. The server is on
    this machine (its process' CPU is read from ``/proc``)."""
    run_id = f"bench-{secrets.token_hex(4)}"
    io = ThreadPoolExecutor(1)
    writer = PostgresTableSinkWriter(
        io,
        dsn=asyncpg_dsn(platform.url),
        schema_name="public",
        table=f"{TABLE}_{'orders' if schema is ORDERS else 'changes'}",
        columns=schema,
        partitioned=schema is ORDERS,
        upsert_key=None,
        run_id=run_id,
        subtask=0,
        attempt="a1",
        via=via,
    )
    io.submit(lambda: None).result()  # the thread exists before the clock starts
    start, cpu = time.perf_counter(), time.process_time()
    for b in batches:
        writer.write_batch("2026-01-01", b)
    out = writer.pre_commit().result()
    seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
    # (the writer's connection is its own, opened by this batch: its server process' CPU)
    server = _backend_cpu(io.submit(lambda: writer._conn.info.backend_pid).result())
    io.submit(writer.close).result()
    io.shutdown()
    with platform.engine.begin() as conn:
        for entry in out.files:
            conn.execute(sa.text(f'DROP TABLE public."{entry["staged_table"]}"'))
    return seconds, cpu, server


def _shape(platform: Platform, name: str, schema: pa.Schema, rows: int, rounds: int) -> None:
    make = orders if schema is ORDERS else changes
    ensure_tables(
        platform.engine,
        "public",
        f"{TABLE}_{name}",
        schema,
        partitioned=schema is ORDERS,
        upsert_key=None,
    )
    batches = [make(s, min(5000, rows - s)) for s in range(0, rows, 5000)]
    paths = {k: v for k, v in PATHS.items() if schema is CHANGES or v != "columns"}
    for via in paths.values():
        stage(platform, schema, batches, via=via)  # warm-up
    runs: dict[str, list[tuple[float, float, float]]] = {name: [] for name in paths}
    for _ in range(rounds):
        for label, via in paths.items():
            runs[label].append(stage(platform, schema, batches, via=via))
    print(f"{name}:")
    medians = {}
    for label, measured in runs.items():
        seconds, cpu, server = (statistics.median(m[i] for m in measured) for i in range(3))
        medians[label] = (rows / seconds, cpu / rows * 1e6, server / rows * 1e6)
        print(
            f"  {label:26} {medians[label][0]:>10,.0f} rows/s, {medians[label][1]:5.2f} µs CPU"
            f" per row in the task's process, {medians[label][2]:5.2f} in the server's"
            f" (medians of {rounds})"
        )
    base = medians["binary COPY (row by row)"]
    for label, (rate, cpu, server) in medians.items():
        if label != "binary COPY (row by row)":
            print(
                f"  {label} / row by row: {rate / base[0]:.2f}x rows/s, {base[1] / cpu:.1f}x"
                f" less task CPU, {server / base[2]:.2f}x the server's CPU"
            )
    if "binary COPY (columns)" in medians:
        csv, columns = medians["CSV COPY (Arrow)"], medians["binary COPY (columns)"]
        print(
            f"  columns / CSV: {columns[0] / csv[0]:.2f}x rows/s, {columns[1] / csv[1]:.2f}x the"
            f" task's CPU, {columns[2] / csv[2]:.2f}x the server's CPU"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    platform = open_platform(load_settings())
    try:
        _shape(platform, "orders", ORDERS, args.rows, args.rounds)
        _shape(platform, "changes", CHANGES, args.rows, args.rounds)
    finally:
        platform.close()


if __name__ == "__main__":
    main()
