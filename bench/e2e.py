"""End-to-end benchmark: Sluice vs. naive Spark vs. a Spark broadcast join vs. the database.

    python bench/e2e.py [--events 1000000] [--files 50] [--users 1000000] [--quick]
                        [--latencies 0,1] [--skip naive,broadcast,pgbench,ceiling,s3,...]
                        [--memory-scaling] [--rounds 3] [--profile /tmp/sluice.svg]
                        [--cdc-changes 1000000] [--kafka-events 50000] [--latency-seconds 30]

Data (generated once, cached under ``<home>/bench/e2e``, regenerated only when a parameter
changes): ``--events`` events in ``--files`` JSON Lines files (``dt=YYYY-MM-DD/`` folders, one
malformed line in ~1000) and a ``--users``-row table ``public.bench_e2e_users`` on the
platform database (the embedded Postgres by default). Then, one after another on ONE Spark
``local[2]`` session (warmed up first), at each injected lookup latency L of ``--latencies``
(milliseconds per round trip, slept client side while the connection is held):

1. **Sluice**: the clickstream example pipeline (``examples.clickstream``, defined through the
   public API) over these files: ``discover`` + ``run_pipeline`` — 2 reader subtasks,
   EXACTLY_ONCE checkpoints every second, lines read, parsed and looked up in blocks (one query
   per block's distinct keys), no lookup cache (``--cache-rows``), Parquet output; plus the
   **cache rows** at L=0 (``bench/_e2e_cache.py``, skip with ``cache``: uniform keys at ~10 %
   hits, narrow keys at ~90 % hits and Zipf-skewed keys, each against the uncached run over
   the same files, with the measured hit rate; in the rounds); and the **orders**
   example (CSV, two lookups — a composite key and a fully cached rate table —, a Map, a
   Filter, a Postgres upsert sink) over as many orders in as many files;
2. **naive Spark**: ``spark.read.json`` → ``df.rdd.mapPartitions`` with one synchronous psycopg
   query per row (prepared) → ``createDataFrame`` → Parquet. At L > 0 it is time-boxed: it runs
   on a prefix of the files sized to ``--naive-seconds`` and its rate is extrapolated
   (labelled in the table);
3. **Spark broadcast join**: the users table read through Spark's JDBC source (Debian's
   ``libpostgresql-jdbc-java``, ``/usr/share/java/postgresql.jar``, installed by the benchmark
   with apt-get when it runs as root, as ``.ci/run`` installs chromium; otherwise skipped with
   a reason that says how to get it) and broadcast-joined to the events, Parquet output. The
   embedded server listens on a Unix socket only and the JDBC driver cannot use one without
   junixsocket, so the benchmark relays 127.0.0.1:<ephemeral port> to the socket (a few round
   trips; latency does not apply, so it is measured once);
4. **the database ceiling**: ``pgbench -M prepared`` with a one-row primary-key lookup script
   and with a 100-key ``= ANY`` script (``--pgbench-clients`` clients, default 8 = Sluice's
   2 tasks x 4 connections; L as ``\\sleep`` before each query);
5. **the ceilings** (``bench/_e2e_ceiling.py``), on the same files without the platform (no
   Spark, no checkpoints), ``CORES`` spawned processes: read → parse (pyarrow.json) → write
   Parquet with no lookup, and the same with one ``= ANY`` lookup per block (asyncpg). Every
   row shows its ratio to both. With the orders row, also the **orders ceiling**
   (``bench/_e2e_orders_ceiling.py``): the orders example's lookups, map and filter in the
   same processes, its output COPied into one staging table and upserted in one transaction;
6. **the small runs** (``bench/_e2e_small.py``, skip with ``small``): Sluice at L=0 over a
   fifth of the events in a fifth of the files (its rate over the main Sluice row's, target
   >= 0.5x; with ``--quick`` both runs are 10x smaller) and over one file of 1,000 events
   (wall seconds of discover + run with the session up, target <= 3 s).

7. **S3** (``bench/_e2e_s3.py``, skip with ``s3`` / ``discovery``): Sluice at L=0 with the
   landing and the warehouse on a local S3 server (moto on 127.0.0.1, the same files uploaded
   once; target >= 0.7x the local-disk L=0 row), and discovery of ``--discovery-objects``
   (100,000; 10,000 with ``--quick``) objects under one prefix against a bare ``pyarrow.fs``
   listing of it (``bench/s3_discovery.py``; target >= 0.5x its rate).

8. **Lakehouse sinks** (``bench/_e2e_lakehouse.py``, skip with ``iceberg`` / ``delta`` /
   ``compaction``): Sluice at L=0 with the clickstream's sink replaced by an ``IcebergSink``
   (Sluice's catalog in the platform database) and by a ``DeltaSink``, each run into a fresh
   table removed after it (files and catalog entries); their rates over the Parquet sink's
   L=0 row (target >= 0.85x, both), Iceberg's checkpoint p50 over the Parquet row's (target
   <= 2x); and compaction of a day of small files (``compact_day``) against a bare PyIceberg
   read + overwrite of the same day (``bench/iceberg_compaction.py``'s measurement, median
   of ``--rounds``; target >= 0.5x its rate).

9. **Stream sources** (``bench/_e2e_streams.py``, skip with ``cdc`` / ``kafka``), in the rounds:
   **CDC** (``_e2e_cdc.py``): per round a fresh table on a Postgres server of its own (a
   second embedded server, ``_e2e_cdc_source.py``) and two pipelines (each its own slot
   and publication; sinks in the platform database); their snapshot (rate informational),
   then ``--cdc-changes`` inserts, updates and deletes; a bare psycopg2 read of the slot to
   the end LSN (the ceiling) against
   Sluice's stream -> Postgres upsert (the apply rate: target >= 0.5x) and stream -> users
   lookup -> Postgres upsert (ratio printed beside it); each sink must equal the table. Then
   the same apply with the table in the platform database (its ratio printed beside).
   **Kafka**
   (``_e2e_kafka.py``): a Tansu broker, ``--kafka-events`` of the files produced once to a
   4-partition topic; the no-platform ceiling (``_e2e_kafka_ceiling.py``, CORES processes)
   against the clickstream over a ``KafkaSource`` -> lookup -> Parquet (target >= 0.5x;
   rows == the valid events). After the rounds, each source's **latency** run: continuous,
   input at half its median rate for ``--latency-seconds``, commit/produce -> visible in the
   committed output, p50 and p99 (target p99 <= the checkpoint interval + 1 s); none with
   ``--latency-seconds 0``.

The ceilings and Sluice's clickstream rows are the median of ``--rounds`` (3) interleaved
rounds (the ceilings, Sluice at each L, the small runs, Sluice on S3, into Iceberg and into
Delta; then again), after one
unmeasured run of each ceiling, each small run and one of Sluice, so that no variant pays
another's start-up.

Both Spark baselines read the files in >= 16 partitions (``spark.sql.files.maxPartitionBytes``)
so that no straggler partition runs alone on one of the two cores.

Columns: rows/s (events, or lookups for pgbench), wall time, CPU seconds of this process and
its descendants (Spark JVM, Python workers; not Postgres), CPU seconds of the database server
(its postmaster, every backend that exited and the live ones; when it runs here), peak RSS
of a Python worker (the largest process forked by the Python daemon ``spark_jobs._daemon``;
high-water marks are reset before each variant through ``/proc/<pid>/clear_refs``, so a
reused worker starts from its current RSS) and of the driver (JVM + Python driver), and the
ratios against naive Spark and against the pgbench one-row ceiling at the same L. Sluice's L
is ``lookup_injected_latency_ms`` (a benchmark-only setting).

``--memory-scaling`` adds two Sluice runs at L=0, back to back in the same (reused) workers:
the events once more, then 5x the events (same file count), and compares a worker's peak RSS;
it also prints the largest worker's RSS at 0/25/50/75/100 % of each run. ``--profile PATH``
records one extra, unmeasured Sluice run at L=0 (``--profile-pipeline orders``: of the orders
example) with ``py-spy record --subprocesses`` (every worker; .svg flame graph, .txt
collapsed stacks or .json speedscope; without ``--native``, so time in the cyclic GC is
charged to the allocating Python frame).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _e2e_cache import cache_plans, cache_verdicts
from _e2e_ceiling import Ceilings
from _e2e_common import (
    VARIANTS,
    Context,
    Result,
    console,
    median_of,
    mib,
)
from _e2e_data import count_lines, landing_files, prepare_events, prepare_orders, prepare_users
from _e2e_lakehouse import lakehouse_plans, lakehouse_verdicts, run_compaction
from _e2e_pgbench import pgbench_binary, run_pgbench
from _e2e_procs import watch_postgres
from _e2e_report import legend, report, verdicts
from _e2e_s3 import run_discovery, s3_landing, s3_plans, s3_verdicts
from _e2e_sluice import profile_sluice, run_orders, run_sluice
from _e2e_small import small_plans, small_verdicts
from _e2e_spark import ensure_jdbc_driver, run_broadcast, run_naive, start_spark
from _e2e_streams import StreamRows
from _harness import one_run_at_a_time

from enumerator_service import asyncpg_dsn, load_settings
from enumerator_service._operations import open_platform


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--files", type=int, default=50)
    parser.add_argument("--users", type=int, default=1_000_000)
    parser.add_argument("--latencies", default="0,1", help="injected ms per round trip")
    parser.add_argument("--skip", default="", help=f"comma-separated, of {','.join(VARIANTS)}")
    parser.add_argument(
        "--memory-scaling", action="store_true", help="add a Sluice run over 5x the events"
    )
    parser.add_argument(
        "--naive-seconds",
        type=float,
        default=45.0,
        help="time box of naive Spark at L > 0 (a prefix of the files)",
    )
    parser.add_argument(
        "--cache-rows", type=int, default=0, help="Sluice's lookup cache per task (0: off)"
    )
    parser.add_argument(
        "--cached-rows",
        type=int,
        default=120_000,
        help="the cache rows' cache per task over uniform (~10 %% hits) and skewed keys",
    )
    parser.add_argument(
        "--narrow-users", type=int, default=20_000, help="users of the ~90 %% hits cache row"
    )
    parser.add_argument("--narrow-cache-rows", type=int, default=19_000, help="its cache per task")
    parser.add_argument("--zipf", type=float, default=1.1, help="exponent of the skewed keys")
    parser.add_argument(
        "--discovery-objects", type=int, default=100_000, help="objects listed (S3 discovery)"
    )
    parser.add_argument(
        "--cdc-changes", type=int, default=1_000_000, help="changes per round of the CDC rows"
    )
    parser.add_argument(
        "--latency-seconds",
        type=float,
        default=30.0,
        help="how long the stream sources' latency runs offer records (0: no latency runs)",
    )
    parser.add_argument(
        "--kafka-events",
        type=int,
        default=50_000,
        help="of the events, produced to the Kafka rows' topic (one record per batch: slow)",
    )
    parser.add_argument("--pgbench-clients", type=int, default=8)
    parser.add_argument("--pgbench-seconds", type=int, default=10)
    parser.add_argument(
        "--pg-cpu-by-statement",
        action="store_true",
        help="charge the database's CPU to lookups, staging, commits (20 Hz sampling: costs CPU)",
    )
    parser.add_argument("--profile", type=Path, help="py-spy output of an extra Sluice run")
    parser.add_argument(
        "--profile-pipeline",
        choices=("clickstream", "orders"),
        default="clickstream",
        help="the pipeline --profile runs",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=3,
        help="interleaved rounds of the ceilings and the Sluice rows (median reported)",
    )
    parser.add_argument("--quick", action="store_true", help="100k events, short time boxes")
    args = parser.parse_args()
    if args.quick:
        args.events, args.naive_seconds, args.pgbench_seconds = 100_000, 10.0, 3
        args.discovery_objects = 10_000
        args.cdc_changes, args.latency_seconds, args.kafka_events = 50_000, 10.0, 20_000
    latencies = [float(x) for x in args.latencies.split(",") if x.strip()]
    skip = {s.strip() for s in args.skip.split(",") if s.strip()}
    if unknown := skip - set(VARIANTS):
        parser.error(f"--skip: unknown {', '.join(sorted(unknown))}")
    if min(args.events, args.files, args.users, args.rounds) < 1 or args.files > args.events:
        parser.error("sizes must be positive, with at most one file per event")

    started = time.perf_counter()
    load = os.getloadavg()
    console.print(f"load average at start: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    settings = load_settings()
    lock = one_run_at_a_time(settings.home_path, "e2e")
    platform = open_platform(settings)
    skipped: list[str] = []
    results: list[Result] = []
    memory: tuple[Result, Result] | None = None
    servers = contextlib.ExitStack()  # the S3 server (started before Spark: its env)
    try:
        landing = prepare_events(settings, args.events, args.files, args.users)
        large = (
            prepare_events(settings, args.events * 5, args.files, args.users)
            if args.memory_scaling and "sluice" not in skip
            else None
        )
        prepare_users(platform, args.users)
        if not watch_postgres(platform.engine, by_statement=args.pg_cpu_by_statement):
            console.print("PG CPU not measured: the database server is not on this machine")
        files = landing_files(landing)
        ctx = Context(
            args, platform, landing, files, count_lines(files), settings.home_path / "bench/e2e"
        )
        if "orders" not in skip:
            ctx.orders = prepare_orders(settings, platform, args.events, args.files, args.users)
        jdbc = False
        if "broadcast" not in skip:
            missing = ensure_jdbc_driver()
            jdbc = missing is None
            if missing is not None:
                skipped.append(missing)
        s3 = None
        if not {"s3", "sluice"} & skip and 0.0 in latencies:
            with console.status("S3: moto_server on 127.0.0.1, the files uploaded…"):
                s3 = servers.enter_context(s3_landing(ctx))
        streams = StreamRows(ctx, skip, servers)  # the Kafka topic produced once, here
        with console.status("Starting Spark (session, Python daemon and workers)…"):
            ctx.spark = start_spark(jdbc)

        def measure(label: str, fn: Callable[[], Result], record: bool = True) -> Result:
            with console.status(f"{label}…"):
                result = fn()
            if record:
                results.append(result)
            console.print(
                f"{label}: {result.rate:,.0f}/s, {result.seconds:,.1f} s, worker "
                f"{mib(result.worker_mib)} MiB, driver {mib(result.driver_mib)} MiB; "
                f"{result.note}"
            )
            return result

        # The ceilings and Sluice's clickstream rows: the median of --rounds interleaved
        # rounds, after one unmeasured run of each (so that no variant pays another's start-up).
        rounds: dict[str, list[Result]] = defaultdict(list)
        plans: list[tuple[str, Callable[[], Result]]] = []
        ceilings = None
        if "ceiling" not in skip:
            ceilings = Ceilings(ctx, asyncpg_dsn(platform.url))
            plans += [
                ("ceiling, no lookup", functools.partial(ceilings.run, lookup=False)),
                ("ceiling, = ANY lookup", functools.partial(ceilings.run, lookup=True)),
            ]
            if ctx.orders is not None:
                plans.append(("ceiling, orders", ceilings.run_orders))
        if "sluice" not in skip:
            plans += [
                (f"Sluice, L={latency:g} ms", functools.partial(run_sluice, ctx, latency))
                for latency in latencies
            ]
            if "small" not in skip and 0.0 in latencies:
                plans += small_plans(ctx, settings)
            if s3 is not None:
                plans += s3_plans(ctx, s3)
            if 0.0 in latencies:
                plans += lakehouse_plans(ctx, skip)
            if "cache" not in skip and args.cached_rows and 0.0 in latencies:
                plans += cache_plans(ctx)
        plans += streams.plans()
        try:
            # (The small runs' labels start with "small": they read other files, so each has
            # its own warm-up, like the ceilings.)
            sluice_plans = [plan for plan in plans if plan[0].startswith("Sluice")]
            warm_ups = [plan for plan in plans if plan not in sluice_plans] + sluice_plans[:1]
            for label, fn in warm_ups:
                measure(f"warm-up: {label} (not measured)", fn, record=False)
            for round_no in range(1, args.rounds + 1):
                for label, fn in plans:
                    rounds[label].append(measure(f"round {round_no}: {label}", fn, record=False))
        finally:
            streams.close()
            if ceilings is not None:
                ceilings.close()
        results.extend(median_of(runs) for runs in rounds.values())
        streams.latencies(results)
        if "sluice" not in skip:
            if "orders" not in skip:
                for latency in latencies:
                    measure(
                        f"Sluice orders, L={latency:g} ms",
                        functools.partial(run_orders, ctx, latency),
                    )
            if large is not None:
                # Back to back, both in workers that already ran the pipeline (a reused worker
                # starts from the RSS its previous task left, not from a fresh fork's).
                small = measure(
                    "Sluice, 1x events, L=0 (memory reference)",
                    lambda: run_sluice(ctx, 0.0, label="Sluice, 1x events"),
                )
                big = measure(
                    "Sluice, 5x events, L=0",
                    lambda: run_sluice(ctx, 0.0, large, "Sluice, 5x events"),
                )
                for run in (small, big):  # reported below the table, not in its groups
                    results.remove(run)
                memory = (small, big)
        if "discovery" not in skip:
            results.extend(run_discovery(ctx))
        if "compaction" not in skip:
            results.extend(run_compaction(ctx))
        if "naive" not in skip:
            naive0: Result | None = None
            for latency in latencies:
                result = measure(
                    f"naive Spark, L={latency:g} ms",
                    functools.partial(run_naive, ctx, latency, naive0),
                )
                naive0 = result if latency == 0 else naive0
        if jdbc:
            try:
                measure("Spark broadcast join", lambda: run_broadcast(ctx))
            except Exception as exc:  # reported; the other variants still run
                skipped.append(f"broadcast join failed: {str(exc).strip().splitlines()[0]}")
        if "pgbench" not in skip:
            binary = pgbench_binary()
            if binary is None:
                skipped.append("pgbench: no pgbench binary (pgserver's or on PATH)")
            else:
                for latency in latencies:
                    for keys in (1, 100):
                        measure(
                            f"pgbench {keys} key(s), L={latency:g} ms",
                            functools.partial(run_pgbench, ctx, binary, keys, latency),
                        )
        if args.profile is not None:
            profile_sluice(ctx, args.profile, args.profile_pipeline)
        console.print(report(ctx, results, skipped))
        console.print(legend(args))
        if memory is not None:
            for run in memory:
                console.print(
                    f"memory scaling, {run.variant} ({run.events:,}, L=0, back to back): "
                    f"{run.rate:,.0f} events/s, {run.seconds:.1f} s, worker peak "
                    f"{mib(run.worker_mib)} MiB; largest worker's RSS at 0/25/50/75/100 % of "
                    f"the run: {' / '.join(f'{m:,.0f}' for m in run.worker_rss or [])} MiB"
                )
        for text in [
            *verdicts(results, memory),
            *small_verdicts(results, args.quick),
            *s3_verdicts(results),
            *lakehouse_verdicts(results),
            *cache_verdicts(results),
            *streams.verdicts(results),
        ]:
            console.print(text)
    finally:
        servers.close()
        platform.close()
        lock.close()
    load = os.getloadavg()
    console.print(
        f"total {time.perf_counter() - started:,.0f} s; load average at the end: "
        f"{load[0]:.2f} {load[1]:.2f} {load[2]:.2f}"
    )


if __name__ == "__main__":
    main()
