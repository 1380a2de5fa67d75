"""Per-block cost of ``BatchLookup`` with and without the partial cache, in process.

    python bench/lookup_blocks.py [--users 1000000] [--blocks 263] [--block-rows 1900]
                                  [--repeat 2] [--profile uniform-cache] [--in-memory]

One ``BatchLookup`` of the clickstream example's step (``user_id`` -> 4 columns of the
``users`` table, ``--users`` rows, on the platform database: the embedded Postgres of
``SLUICE_HOME``) is fed ``--blocks`` blocks of ``--block-rows`` events one after another, as
one reader task of ``bench/e2e.py`` sees them (1M events, 2 tasks: ~263 blocks of ~1,900).
Key distributions as in the bench's cache rows: **uniform** over all users (cache
``--cached-rows``, ~10 % hits), **narrow** over 20,000 of them (cache 19,000, ~90 % hits),
**skewed** Zipf 1.1 (cache ``--cached-rows``). Each case runs without and with the cache,
interleaved, ``--repeat`` times; printed: CPU seconds of this process (``process_time``: the
worker's side, client decoding included) per block, wall milliseconds per block, and the hit
rate. ``--profile CASE`` prints the top of a cProfile of one run of that case.
``--in-memory`` answers the queries from an Arrow copy of the table (loaded once, sorted by
key) instead of Postgres: the step's own client CPU (cache, join, miss policy) without the
query's encoding and decoding, so the cache path's cost shows without the database's noise.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import itertools
import os
import pstats
import random
import sys
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from enumerator_service import asyncpg_dsn, load_settings
from enumerator_service._operations import open_platform
from examples._clickstream_data import load_users
from spark_jobs import FileSource, Lookup, PartialCache, Pipeline
from spark_jobs.async_io import ResultFuture
from spark_jobs.lookup import BatchLookup
from spark_jobs.lookup._batch_join import Found
from spark_jobs.lookup._full_cache import LOAD_CHUNK_ROWS, load_table
from spark_jobs.pipeline._plan import LookupPlan
from spark_jobs.source._batch import Batch, with_offsets

SCHEMA = {
    "event_id": "string",
    "user_id": "int64",
    "event_time": "timestamp",
    "event_type": "string",
    "amount": "float64",
}
COLUMNS = {"name": "user_name", "country": "user_country", "tier": "user_tier"}
COLUMNS["signup_time"] = "user_signup_time"


def plan_of(table: str, cache_rows: int) -> LookupPlan:
    cache = PartialCache(cache_rows) if cache_rows else None
    step = Lookup(f"public.{table}", on={"user_id": "id"}, columns=COLUMNS, cache=cache)
    pipeline = Pipeline("lookup_blocks", FileSource(dict(SCHEMA), partition_by=None), [step])
    stage = pipeline.plan.stages[0]
    assert isinstance(stage, LookupPlan)
    return stage


def blocks_of(keys: list[int], size: int) -> list[Batch]:
    out = []
    for i, start in enumerate(range(0, len(keys), size)):
        part = keys[start : start + size]
        n = len(part)
        rows = pa.RecordBatch.from_pydict(
            {
                "event_id": [f"e{start + j}" for j in range(n)],
                "user_id": pa.array(part, pa.int64()),
                "event_time": pa.array([1_700_000_000_000_000] * n, pa.timestamp("us")),
                "event_type": ["click"] * n,
                "amount": [1.5] * n,
            }
        )
        out.append(Batch(i, with_offsets(rows, range(start, start + n)), (start, start + n)))
    return out


class InMemoryLookup(BatchLookup):
    """A BatchLookup whose queries are answered from an in-memory copy of the table."""

    rows: Found | None = None  # the table sorted by key, loaded by the first open()

    async def open(self) -> None:
        await super().open()
        if InMemoryLookup.rows is None:
            assert self._pool is not None and self._shape is not None
            found = await load_table(
                self._pool, self._shape, chunk_rows=LOAD_CHUNK_ROWS, timeout=None
            )
            order = pc.sort_indices(found.keys[0])
            InMemoryLookup.rows = Found(
                (found.keys[0].take(order),), tuple(v.take(order) for v in found.values)
            )

    async def _query(self, keys: list[pa.Array]) -> Found:
        rows = InMemoryLookup.rows
        assert rows is not None
        ids = rows.keys[0]
        at = pc.search_sorted(ids.slice(0, len(ids) - 1), keys[0])
        at = at.filter(pc.equal(ids.take(at), keys[0]))  # the keys the table has
        self.batches += 1
        self.keys_queried += len(keys[0])
        self.rows_fetched += len(at)
        return Found((ids.take(at),), tuple(v.take(at) for v in rows.values))


class Sink(ResultFuture[Batch]):
    def __init__(self) -> None:
        self.future: asyncio.Future[list[Batch]] = asyncio.get_running_loop().create_future()

    def complete(self, results: Any) -> None:
        self.future.set_result(list(results))

    def complete_exceptionally(self, error: BaseException) -> None:
        self.future.set_exception(error)


async def run(
    dsn: str, table: str, blocks: list[Batch], cache_rows: int, in_memory: bool = False
) -> dict[str, float]:
    plan = plan_of(table, cache_rows)
    schema = blocks[0].rows.schema
    types = {
        "user_name": pa.string(),
        "user_country": pa.string(),
        "user_tier": pa.string(),
        "user_signup_time": pa.timestamp("us", tz="UTC"),
    }
    kind = InMemoryLookup if in_memory else BatchLookup
    lookup = kind(plan, dsn, input_schema=schema, column_types=types, batch_size=4096, pool_size=4)
    await lookup.open()
    try:
        cpu, wall = time.process_time(), time.perf_counter()
        for block in blocks:
            sink = Sink()
            lookup.async_invoke(block, sink)
            await sink.future
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    finally:
        await lookup.close()
    asked = lookup.cache_hits + lookup.cache_misses
    return {
        "cpu_ms": 1000 * cpu / len(blocks),
        "wall_ms": 1000 * wall / len(blocks),
        "hits": lookup.cache_hits / asked if asked else 0.0,
        "bypassed": lookup.cache_bypassed,
    }


def keys_for(case: str, users: int, count: int, rng: random.Random) -> list[int]:
    if case == "narrow":
        hot = rng.sample(range(1, users + 1), 20_000)
        return [rng.choice(hot) for _ in range(count)]
    if case == "skewed":
        cumulative = list(itertools.accumulate(1.0 / r**1.1 for r in range(1, users + 1)))
        ids = list(range(1, users + 1))
        rng.shuffle(ids)
        ranks = rng.choices(range(1, users + 1), cum_weights=cumulative, k=count)
        return [ids[r - 1] for r in ranks]
    return [rng.randint(1, users) for _ in range(count)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--users", type=int, default=1_000_000)
    parser.add_argument("--blocks", type=int, default=263)
    parser.add_argument("--block-rows", type=int, default=1900)
    parser.add_argument("--cached-rows", type=int, default=120_000)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--cases", default="uniform,narrow,skewed")
    parser.add_argument("--profile", help="CASE-cache or CASE-nocache: cProfile one run")
    parser.add_argument("--in-memory", action="store_true", help="no Postgres for the queries")
    args = parser.parse_args()
    settings = load_settings()
    platform = open_platform(settings)
    dsn = asyncpg_dsn(platform.url)
    table = "bench_lookup_blocks_users"
    load_users(dsn, schema="public", table=table, key="id", users=args.users, seed=7)
    rng = random.Random(11)
    count = args.blocks * args.block_rows
    sizes = {"uniform": args.cached_rows, "narrow": 19_000, "skewed": args.cached_rows}
    print(f"load {os.getloadavg()}")
    for case in args.cases.split(","):
        blocks = blocks_of(keys_for(case, args.users, count, rng), args.block_rows)
        if args.profile and args.profile.startswith(case):
            rows = sizes[case] if args.profile.endswith("-cache") else 0
            profile = cProfile.Profile()
            profile.enable()
            asyncio.run(run(dsn, table, blocks, rows, args.in_memory))
            profile.disable()
            pstats.Stats(profile).sort_stats("tottime").print_stats(25)
            continue
        for attempt in range(args.repeat):
            for rows in (0, sizes[case]):
                result = asyncio.run(run(dsn, table, blocks, rows, args.in_memory))
                print(
                    f"{case:8} cache={rows:>7,} #{attempt}: {result['cpu_ms']:6.2f} ms CPU/block "
                    f"{result['wall_ms']:6.2f} ms wall/block hits {result['hits']:.2f} "
                    f"bypassed {result['bypassed']:,.0f} load {os.getloadavg()[0]:.1f}"
                )
    platform.close()


if __name__ == "__main__":
    main()
