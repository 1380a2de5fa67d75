"""Lookup throughput: Sluice's async operator with batched lookups vs per-row baselines.

    python bench/lookup.py [--keys 50000] [--users 1000000]

Runs against the platform database (embedded Postgres unless SLUICE_DATABASE_URL is set),
creating the ``users`` table if needed, and prints one table with ratios measured in this run.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import time
from collections.abc import Callable
from typing import Any

import asyncpg
import psycopg
from rich.console import Console
from rich.table import Table

from enumerator_service import asyncpg_dsn, load_settings
from enumerator_service._demo_data import load_users
from enumerator_service._operations import open_platform
from spark_jobs.async_io import AsyncWaitOperator, Output, OutputMode
from spark_jobs.lookup import PostgresLookup
from spark_jobs.runtime import MailboxController, MailboxProcessor

SQL_ONE = "SELECT id, name, country, tier, signup_time FROM public.users WHERE id = $1"


def sync_per_row(dsn: str, keys: list[int]) -> int:
    found = 0
    with psycopg.connect(dsn) as conn, conn.cursor() as cur:
        for key in keys:
            cur.execute(SQL_ONE.replace("$1", "%s"), (key,), prepare=True)
            found += cur.fetchone() is not None
    return found


async def async_per_row(dsn: str, keys: list[int], capacity: int = 100) -> int:
    pool = await asyncpg.create_pool(dsn, min_size=4, max_size=4)
    semaphore = asyncio.Semaphore(capacity)
    found = 0

    async def one(key: int) -> None:
        nonlocal found
        async with semaphore:
            row = await pool.fetchrow(SQL_ONE, key)
        found += row is not None

    await asyncio.gather(*(one(k) for k in keys))
    await pool.close()
    return found


async def sluice_operator(dsn: str, keys: list[int], capacity: int, batch: int) -> int:
    found = 0
    feed = iter(keys)

    def collect(row: Any, _ts: int | None) -> None:
        nonlocal found
        found += row is not None

    def default_action(controller: MailboxController) -> None:
        for _ in range(512):
            if not operator.has_capacity():
                operator.notify_when_available(controller.suspend_default_action().resume)
                return
            key = next(feed, None)
            if key is None:
                controller.suspend_default_action()
                operator.notify_when_drained(processor.all_actions_completed)
                return
            operator.process_element(key)

    processor = MailboxProcessor(default_action)
    lookup: PostgresLookup[int, Any] = PostgresLookup(
        dsn,
        schema="public",
        table="users",
        key_column="id",
        columns=("name", "country", "tier", "signup_time"),
        key_of=lambda k: k,
        joiner=lambda _k, row: row,
        max_batch_size=batch,
        pool_size=4,
    )
    operator = AsyncWaitOperator(
        lookup,
        Output(collect, lambda _m: None),
        processor,
        capacity=capacity,
        mode=OutputMode.ORDERED,
    )
    await operator.open()
    await processor.run_loop()
    await operator.close()
    return found


def timed(fn: Callable[[], int]) -> tuple[float, int]:
    start = time.perf_counter()
    found = fn()
    return time.perf_counter() - start, found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--keys", type=int, default=50_000)
    parser.add_argument("--users", type=int, default=1_000_000)
    args = parser.parse_args()
    settings = load_settings()
    platform = open_platform(settings)
    dsn = asyncpg_dsn(platform.url)
    console = Console()
    with console.status(f"Preparing users table ({args.users:,} rows)…"):
        load_users(dsn, schema="public", table="users", key="id", users=args.users, seed=7)
    keys = [random.Random(1).randint(1, args.users) for _ in range(args.keys)]
    runs = [
        ("sync per-row (psycopg)", lambda: sync_per_row(dsn, keys)),
        ("async per-row (asyncpg, capacity 100)", lambda: asyncio.run(async_per_row(dsn, keys))),
        (
            "Sluice AsyncWaitOperator, batched (cap 512, batch 256)",
            lambda: asyncio.run(sluice_operator(dsn, keys, 512, 256)),
        ),
    ]
    results = []
    for name, fn in runs:
        with console.status(name):
            seconds, found = timed(fn)
        assert found == len(keys), f"{name}: {found} of {len(keys)} keys found"
        results.append((name, seconds))
    base = len(keys) / results[0][1]
    table = Table(title=f"{len(keys):,} lookups of random keys in {args.users:,} users")
    for column in ("variant", "seconds", "lookups/s", "vs sync per-row"):
        table.add_column(column, justify="left" if column == "variant" else "right")
    for name, seconds in results:
        rate = len(keys) / seconds
        table.add_row(name, f"{seconds:.2f}", f"{rate:,.0f}", f"{rate / base:.1f}x")
    console.print(table)
    platform.close()


if __name__ == "__main__":
    main()
