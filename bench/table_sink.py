"""The Postgres table sink's staging COPY: rows/s of CSV COPY (Arrow-rendered) against binary
COPY (one ``write_row`` per row), same rows, same invocation.

    python bench/table_sink.py [--rows 200000] [--rounds 3]

Stages ``--rows`` rows shaped like the orders example's output (strings, integers,
decimals, a UTC timestamp; day-partitioned) through ``PostgresTableSinkWriter`` in batches of
5,000, one pre-commit at the end, on the platform database of ``load_settings()``; each path
once unmeasured, then ``--rounds`` interleaved rounds, and prints each path's median and the
ratio. Measures the writer thread end to end (rendering, COPY, commit; wall, with the
server's parsing) and the CPU seconds of this process (what a Spark task pays), not a run.
The staged rows are deleted afterwards.
"""

from __future__ import annotations

import argparse
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

SCHEMA = pa.schema(
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
TABLE = "bench_table_sink"


def batch(start: int, rows: int) -> pa.RecordBatch:
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
        schema=SCHEMA,
    )


def stage(
    platform: Platform, batches: list[pa.RecordBatch], *, via_csv: bool
) -> tuple[float, float]:
    """(Wall seconds, this process' CPU seconds) to stage and pre-commit ``batches``; the
    staged batch tables are dropped after."""
    run_id = f"bench-{secrets.token_hex(4)}"
    io = ThreadPoolExecutor(1)
    writer = PostgresTableSinkWriter(
        io,
        dsn=asyncpg_dsn(platform.url),
        schema_name="public",
        table=TABLE,
        columns=SCHEMA,
        partitioned=True,
        upsert_key=None,
        run_id=run_id,
        subtask=0,
        attempt="a1",
        via_csv=via_csv,
    )
    io.submit(lambda: None).result()  # the thread exists before the clock starts
    start, cpu = time.perf_counter(), time.process_time()
    for b in batches:
        writer.write_batch("2026-01-01", b)
    out = writer.pre_commit().result()
    seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
    io.submit(writer.close).result()
    io.shutdown()
    with platform.engine.begin() as conn:
        for entry in out.files:
            conn.execute(sa.text(f'DROP TABLE public."{entry["staged_table"]}"'))
    return seconds, cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    platform = open_platform(load_settings())
    try:
        ensure_tables(platform.engine, "public", TABLE, SCHEMA, partitioned=True, upsert_key=None)
        batches = [batch(s, min(5000, args.rows - s)) for s in range(0, args.rows, 5000)]
        paths = {"binary COPY (row by row)": False, "CSV COPY (Arrow)": True}
        for via_csv in paths.values():
            stage(platform, batches, via_csv=via_csv)  # warm-up
        runs: dict[str, list[tuple[float, float]]] = {name: [] for name in paths}
        for _ in range(args.rounds):
            for name, via_csv in paths.items():
                runs[name].append(stage(platform, batches, via_csv=via_csv))
        rates, cpu_us = {}, {}
        for name, measured in runs.items():
            rates[name] = args.rows / statistics.median(s for s, _ in measured)
            cpu_us[name] = statistics.median(c for _, c in measured) / args.rows * 1e6
            print(
                f"{name:26} {rates[name]:>10,.0f} rows/s, {cpu_us[name]:5.2f} µs CPU per row in"
                f" the task's process (medians of {args.rounds})"
            )
        (binary, csv), (binary_cpu, csv_cpu) = rates.values(), cpu_us.values()
        print(f"CSV / binary: {csv / binary:.2f}x rows/s, {binary_cpu / csv_cpu:.1f}x less CPU")
    finally:
        platform.close()


if __name__ == "__main__":
    main()
