"""Async I/O benchmark: operator overhead, and lookups against the database.

    python bench/async_io.py [--elements 1000000] [--keys 200000] [--quick]

Part 1 runs a trivial async function through the AsyncWaitOperator in every mode and compares
it with a hand-rolled ``asyncio.Semaphore`` + tasks loop measured in the same run; then key
mode (FLIP-519) over 10,000 distinct keys against unordered mode, alternating the two in the
same run (target >= 0.8x). Part 2 looks
up random keys of the 1M-row ``users`` table with an injected client-side latency L per round
trip (held while the connection is held, like network latency): synchronous per-row lookups
(psycopg), the operator doing per-row lookups (capacity 100), and the operator with batched
lookups. Each figure is the best of ``--repeat`` runs; ratios come from this run only.

Targets. Part 1: the operator against the hand-rolled loop. Part 2 at L = 1 ms: against the
*bare asyncpg ceiling* of the same run (asyncpg alone, same keys, 64 connections) — the
synchronous baseline is latency-bound while the operator is CPU-bound, so a ratio to the
baseline depends on the machine's speed and one to the ceiling does not: per-row >= 0.9x the
ceiling, batched >= 4x (the earlier target of 100x the synchronous baseline, restated with the
reference machine's figures: 100 x 845/s / 21,533/s = 3.9x). At L = 0, batched >= 10x the
synchronous baseline (unchanged).
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import asyncpg
import psycopg
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _harness import run_operator

from enumerator_service import asyncpg_dsn, load_settings
from enumerator_service._operations import open_platform
from examples._clickstream_data import load_users
from spark_jobs.async_io import (
    AsyncFunction,
    CoroutineAsyncFunction,
    OutputMode,
    ResultFuture,
)
from spark_jobs.lookup import PostgresLookup
from spark_jobs.runtime import run_task

console = Console(width=150)
CAPACITY = 100
#: Part 2 targets per (latency, variant): (the baseline the ratio is to, the ratio).
CEILING, SYNC = "ceiling", "sync"
TARGETS: dict[tuple[float, str], tuple[str, float]] = {
    (0.0, "batched"): (SYNC, 10.0),
    (0.001, "per-row"): (CEILING, 0.9),
    (0.001, "batched"): (CEILING, 4.0),
}


def verdict(ratio: float, target: float, unit: str = "x") -> str:
    return f"{'PASS' if ratio >= target else 'FAIL'} (>= {target:g}{unit})"


class TrivialCoroutine(CoroutineAsyncFunction[int, int]):
    async def invoke(self, value: int) -> list[int]:
        return [value]


class TrivialCallback(AsyncFunction[int, int]):
    """Flink's callback style: completes on the next event-loop iteration."""

    def async_invoke(self, value: int, result_future: ResultFuture[int]) -> None:
        asyncio.get_running_loop().call_soon(result_future.complete, [value])


async def hand_rolled(n: int, capacity: int) -> int:
    """What a Python developer writes without Sluice: a semaphore and one task per element."""
    semaphore = asyncio.Semaphore(capacity)
    done = 0
    tasks: set[asyncio.Task[None]] = set()

    async def function(x: int) -> list[int]:
        return [x]

    async def one(x: int) -> None:
        nonlocal done
        try:
            done += len(await function(x))
        finally:
            semaphore.release()

    for x in range(n):
        await semaphore.acquire()
        task = asyncio.create_task(one(x))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
    while tasks:
        await asyncio.gather(*list(tasks))
    return done


def best(fn: Callable[[], Any], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def part1(n: int, repeat: int) -> Table:
    base = best(lambda: asyncio.run(hand_rolled(n, CAPACITY)), repeat)
    table = Table(title=f"1. Operator overhead: {n:,} elements, capacity {CAPACITY}")
    for column in ("variant", "elements/s", "vs hand-rolled", "target"):
        table.add_column(column, justify="left" if column == "variant" else "right")
    table.add_row("hand-rolled asyncio.Semaphore + tasks", f"{n / base:,.0f}", "1.00x", "")
    for style, function in (("coroutine", TrivialCoroutine), ("callback", TrivialCallback)):
        for mode in (OutputMode.ORDERED, OutputMode.UNORDERED):
            for timeout in (None, 60.0):
                seconds = best(
                    lambda f=function, m=mode, t=timeout: asyncio.run(
                        run_operator(f(), iter(range(n)), capacity=CAPACITY, mode=m, timeout=t)
                    ),
                    repeat,
                )
                ratio = base / seconds
                target = 0.6 if timeout else 0.8
                table.add_row(
                    f"Sluice {mode.value}, {style} function, timeouts {'on' if timeout else 'off'}",
                    f"{n / seconds:,.0f}",
                    f"{ratio:.2f}x",
                    verdict(ratio, target),
                )
    return table


KEY_MODE_KEYS = 10_000


def part1_key_mode(n: int, repeat: int) -> Table:
    """Key mode against unordered mode, same function and input, measured alternately (the
    machine is shared: alternating spreads a noisy moment over both). Input value v has key
    v % 10,000: with capacity 100 two records of one key are never in flight together, so
    this measures the bookkeeping of key mode, not waiting."""

    def one_key(value: int) -> tuple[int]:
        return (value % KEY_MODE_KEYS,)

    table = Table(
        title=f"1b. Key mode ({KEY_MODE_KEYS:,} distinct keys) vs unordered: {n:,} elements, "
        f"capacity {CAPACITY}"
    )
    for column in ("variant", "unordered el/s", "key el/s", "key / unordered", "target"):
        table.add_column(column, justify="left" if column == "variant" else "right")
    for style, function in (("coroutine", TrivialCoroutine), ("callback", TrivialCallback)):
        for timeout in (None, 60.0):
            times: dict[OutputMode, list[float]] = {OutputMode.UNORDERED: [], OutputMode.KEY: []}
            for _ in range(repeat):
                for mode in times:
                    key = one_key if mode is OutputMode.KEY else None
                    start = time.perf_counter()
                    asyncio.run(
                        run_operator(
                            function(), iter(range(n)), capacity=CAPACITY, mode=mode,
                            timeout=timeout, key=key,
                        )
                    )  # fmt: skip
                    times[mode].append(time.perf_counter() - start)
            unordered, keyed = min(times[OutputMode.UNORDERED]), min(times[OutputMode.KEY])
            ratio = unordered / keyed
            table.add_row(
                f"{style} function, timeouts {'on' if timeout else 'off'}",
                f"{n / unordered:,.0f}",
                f"{n / keyed:,.0f}",
                f"{ratio:.2f}x",
                verdict(ratio, 0.8),
            )
    return table


SQL_ONE = "SELECT id, name, country, tier, signup_time FROM public.users WHERE id = %s"


def sync_per_row(dsn: str, keys: list[int], latency: float) -> int:
    found = 0
    with psycopg.connect(dsn) as conn, conn.cursor() as cur:
        for key in keys:
            if latency:
                time.sleep(latency)
            cur.execute(SQL_ONE, (key,), prepare=True)
            found += cur.fetchone() is not None
    return found


def bare_asyncpg_per_row(dsn: str, keys: list[int], latency: float, connections: int) -> int:
    """The per-row ceiling of this machine: asyncpg alone, one prepared statement per
    connection, each connection looping over the shared keys, no operator, no mailbox."""
    sql = SQL_ONE.replace("%s", "$1")

    async def main() -> int:
        conns = [await asyncpg.connect(dsn) for _ in range(connections)]
        try:
            statements = [await conn.prepare(sql) for conn in conns]
            shared = iter(keys)
            found = 0

            async def worker(statement: Any) -> None:
                nonlocal found
                for key in shared:
                    if latency:
                        await asyncio.sleep(latency)
                    rows = await statement.fetch(key)  # not "found += await …": a lost update
                    found += len(rows)

            await asyncio.gather(*(worker(s) for s in statements))
            return found
        finally:
            for conn in conns:
                await conn.close()

    return run_task(main)


def operator_lookups(
    dsn: str, keys: list[int], latency: float, *, batch: int, capacity: int, pool: int
) -> tuple[int, dict[str, Any]]:
    found = 0

    def collect(row: Any, _ts: int | None) -> None:
        nonlocal found
        found += row is not None

    lookup: PostgresLookup[int, Any] = PostgresLookup(
        dsn,
        schema="public",
        table="users",
        key_column="id",
        columns=("name", "country", "tier", "signup_time"),
        key_of=lambda k: k,
        joiner=lambda _k, row: row,
        max_batch_size=batch,
        pool_size=pool,
        latency=latency,
    )
    # The loop Sluice tasks run on (uvloop); part 1 compares loops of the same kind.
    run_task(
        lambda: run_operator(
            lookup, iter(keys), capacity=capacity, mode=OutputMode.ORDERED, collect=collect
        )
    )
    metrics = lookup.metrics()
    return found, {"batches": metrics.batches, "p50": metrics.p50_ms, "p99": metrics.p99_ms}


def part2(
    dsn: str, keys: list[int], users: int, latencies: list[float], sync_budget: float
) -> Table:
    table = Table(title=f"2. Lookups of {len(keys):,} random keys in {users:,} users")
    for column in (
        "L",
        "variant",
        "lookups/s",
        "vs sync per-row",
        "vs ceiling",
        "queries",
        "p50 / p99 ms",
        "target",
    ):
        table.add_column(column, justify="left" if column in ("L", "variant") else "right")
    for latency in latencies:
        # The synchronous baseline is measured on a prefix sized to ~sync_budget seconds.
        sample = keys[: max(500, min(len(keys), int(sync_budget / (latency + 25e-6))))]
        start = time.perf_counter()
        assert sync_per_row(dsn, sample, latency) == len(sample)
        base_rate = len(sample) / (time.perf_counter() - start)
        label = f"{latency * 1000:g} ms"
        table.add_row(
            label,
            f"sync per-row, psycopg ({len(sample):,} keys)",
            f"{base_rate:,.0f}",
            "1.0x",
            "",
            f"{len(sample):,}",
            "",
            "",
        )
        start = time.perf_counter()
        assert bare_asyncpg_per_row(dsn, keys, latency, 64) == len(keys)
        bare = len(keys) / (time.perf_counter() - start)
        table.add_row(
            label,
            "ceiling: bare asyncpg per-row, 64 connections, no operator",
            f"{bare:,.0f}",
            f"{bare / base_rate:.1f}x",
            "1.00x",
            f"{len(keys):,}",
            "",
            "",
        )
        variants = (
            ("per-row", "Sluice per-row, capacity 100, pool 64", 1, 100, 64),
            ("batched", "Sluice batched (256), capacity 1024, pool 4", 256, 1024, 4),
        )
        for kind, name, batch, capacity, pool in variants:
            start = time.perf_counter()
            found, metrics = operator_lookups(
                dsn, keys, latency, batch=batch, capacity=capacity, pool=pool
            )
            rate = len(keys) / (time.perf_counter() - start)
            assert found == len(keys), f"{name}: {found} of {len(keys)} found"
            ratios = {SYNC: rate / base_rate, CEILING: rate / bare}
            target = TARGETS.get((latency, kind))
            table.add_row(
                label,
                name,
                f"{rate:,.0f}",
                f"{ratios[SYNC]:.1f}x",
                f"{ratios[CEILING]:.2f}x",
                f"{metrics['batches']:,}",
                f"{metrics['p50']:.2f} / {metrics['p99']:.2f}",
                ""
                if target is None
                else verdict(
                    ratios[target[0]],
                    target[1],
                    "x sync per-row" if target[0] == SYNC else "x ceiling",
                ),
            )
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--elements", type=int, default=1_000_000)
    parser.add_argument("--keys", type=int, default=200_000)
    parser.add_argument("--users", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument(
        "--sync-seconds",
        type=float,
        default=5.0,
        help="time budget of the synchronous per-row baseline per latency",
    )
    parser.add_argument("--quick", action="store_true", help="small sizes, one repeat")
    parser.add_argument("--part", type=int, choices=(1, 2), help="run only part 1 or part 2")
    args = parser.parse_args()
    if args.quick:
        args.elements, args.keys, args.repeat, args.sync_seconds = 100_000, 20_000, 1, 1.0

    if args.part != 2:
        console.print(part1(args.elements, args.repeat))
        console.print(part1_key_mode(args.elements, args.repeat))
    if args.part == 1:
        return

    settings = load_settings()
    platform = open_platform(settings)
    dsn = asyncpg_dsn(platform.url)
    with console.status(f"Preparing users table ({args.users:,} rows)…"):
        load_users(dsn, schema="public", table="users", key="id", users=args.users, seed=7)
    rng = random.Random(1)
    keys = [rng.randint(1, args.users) for _ in range(args.keys)]
    console.print(part2(dsn, keys, args.users, [0.0, 0.001], args.sync_seconds))
    platform.close()


if __name__ == "__main__":
    main()
