"""``bench/e2e.py``: the result table, its legend and the target verdicts."""

from __future__ import annotations

import argparse

from _e2e_common import (
    CORES,
    MASTER,
    TARGET_MEMORY,
    TARGET_ORDERS_VS_CEILING,
    TARGET_VS_BROADCAST,
    TARGET_VS_LOOKUP_L0,
    TARGET_VS_NAIVE_L0,
    TARGET_VS_NAIVE_L1,
    TARGET_VS_PLAIN_L0,
    TARGET_VS_PLAIN_L1,
    Context,
    Result,
    mib,
)
from _harness import verdict_line
from rich.table import Table

# -- report ----------------------------------------------------------------------------


def report(ctx: Context, results: list[Result], skipped: list[str]) -> Table:
    def find(kind: str, latency: float | None) -> Result | None:
        return next((r for r in results if r.kind == kind and r.latency_ms == latency), None)

    table = Table(
        title=(
            f"End to end: {ctx.events:,} events in {len(ctx.files)} files, "
            f"{ctx.args.users:,} users, Spark {MASTER}; L = injected latency per lookup "
            "round trip"
        ),
        caption=(
            "CPU s: this process + descendants (Spark JVM, Python workers), not Postgres; "
            "PG CPU s: the database server's (when it runs on this machine). "
            "Worker MiB: peak RSS of the largest Python worker; driver MiB: JVM + Python "
            "driver (the JVM keeps heap from earlier variants). Ratios: rows/s over naive "
            "Spark's and over pgbench one-row lookups/s at the same L (broadcast: L=0), and "
            "over the two ceilings of this invocation (no platform, measured once): 'ceiling' "
            "= read, parse, write with no lookup; 'lookup ceiling' = the same plus one = ANY "
            "query per block."
        ),
    )
    table.add_column("L", no_wrap=True)
    table.add_column("variant", min_width=30)
    for column in (
        "rows",
        "rows/s",
        "wall s",
        "CPU s",
        "PG CPU s",
        "worker MiB",
        "driver MiB",
        "vs naive",
        "vs pgbench 1-row",
        "vs ceiling",
        "vs lookup ceiling",
    ):
        table.add_column(column, justify="right", no_wrap=True)
    table.add_column("note", min_width=40)
    groups = [r.latency_ms for r in results if r.latency_ms is not None]
    for latency in [*dict.fromkeys(groups), None]:
        rows = [r for r in results if r.latency_ms == latency]
        if not rows:
            continue
        naive = find("naive", 0.0 if latency is None else latency)
        ceiling = find("pgbench1", 0.0 if latency is None else latency)
        plain, lookup = find("ceiling-plain", None), find("ceiling-lookup", None)
        for r in rows:
            # (discovery rows count objects listed: no ratio to the events' baselines)
            # (nor compaction rows: rows of a rewritten day, not events; nor the stream
            # sources' rows: other input, compared with their own ceilings in the verdicts)
            same = not r.kind.startswith(("discovery", "compaction", "cdc", "kafka"))
            wall = f"{r.seconds:,.1f}"
            if r.extrapolated_seconds is not None:
                wall += f" (full: ~{r.extrapolated_seconds:,.0f})"
            table.add_row(
                "once" if latency is None else f"{latency:g} ms",
                r.variant,
                f"{r.events:,}",
                f"{r.rate:,.0f}",
                wall,
                "-" if r.cpu is None else f"{r.cpu:,.1f}",
                "-" if r.postgres_cpu is None else f"{r.postgres_cpu:,.1f}",
                mib(r.worker_mib),
                mib(r.driver_mib),
                f"{r.rate / naive.rate:,.1f}x" if naive and same else "-",
                f"{r.rate / ceiling.rate:,.2f}x" if ceiling and same else "-",
                f"{r.rate / plain.rate:,.2f}x" if plain and same else "-",
                f"{r.rate / lookup.rate:,.2f}x" if lookup and same else "-",
                r.note,
            )
        table.add_section()
    for reason in skipped:
        table.add_row("", f"[dim]skipped: {reason}[/dim]", *[""] * 12)
    return table


def legend(args: argparse.Namespace) -> str:
    return (
        "Sluice: the clickstream example pipeline, discover + run_pipeline, 2 reader subtasks, "
        "EXACTLY_ONCE checkpoints every "
        "1 s, lines read, parsed (Arrow) and looked up in 256 KiB blocks (~1,900 events, one "
        "array_agg query per block's distinct keys, 4 connections, 8 blocks in flight), "
        f"lookup cache {args.cache_rows:,} rows per task, Parquet by day; cache rows "
        f"(bench/_e2e_cache.py): the same with a {args.cached_rows:,}-row cache (uniform and "
        f"Zipf {args.zipf:g} keys) and a {args.narrow_cache_rows:,}-row cache (keys over "
        f"{args.narrow_users:,} users), in the rounds.\n"
        "naive Spark: spark.read.json -> df.rdd.mapPartitions with one prepared psycopg query "
        "per row (L slept before each) -> createDataFrame -> Parquet by day; at L > 0 on a "
        f"prefix of the files sized to ~{args.naive_seconds:g} s, rate extrapolated.\n"
        "Spark broadcast join: users through the JDBC source (2 partitions) broadcast-joined "
        "to the events -> Parquet by day.\n"
        f"pgbench: -M prepared -c {args.pgbench_clients} -j {CORES} -T {args.pgbench_seconds}, "
        "L as \\sleep before each query; rows = lookups (tps x keys per query).\n"
        f"ceilings (no Spark, no checkpoints): {CORES} spawned processes, each over every "
        f"{CORES}th file in 256 KiB blocks of whole lines -> pyarrow.json -> Parquet, with "
        "or without one array_agg = ANY query per block (asyncpg, one connection per process); "
        f"these and the Sluice clickstream rows are the median of {args.rounds} interleaved "
        "rounds after one unmeasured run of each.\n"
        "S3 (bench/_e2e_s3.py): the Sluice L=0 run with landing and warehouse on moto_server "
        "(127.0.0.1, its own process; the same files uploaded once), in the rounds; discovery: "
        f"ObjectLanding's listing of {args.discovery_objects:,} objects under one prefix vs a "
        "bare pyarrow.fs listing of it, best of 3 (moto in this process, its listing made "
        "linear: bench/s3_discovery.py).\n"
        "Iceberg / Delta (bench/_e2e_lakehouse.py): the Sluice L=0 run with IcebergSink (Sluice's "
        "catalog, day(event_time)) / DeltaSink (dt) instead of Parquet, a fresh table each run, "
        "in the rounds; compaction: compact_day vs a bare PyIceberg scan + overwrite of the "
        "same day of small files, rows of the day / median wall s (bench/iceberg_compaction.py).\n"
        f"CDC (bench/_e2e_cdc.py): {args.cdc_changes:,} changes (60 % inserts, 30 % updates, "
        "10 % deletes, 1,000 per step) to a table on a Postgres server of its own (url_env; "
        "once more in the platform database, apply only), committed after a fresh slot's "
        "snapshot; ceiling = a bare psycopg2 pgoutput read of the slot to the end LSN; Sluice = "
        "discover + a bounded run, without and with a lookup of the users, Postgres upsert sink "
        "in the platform database (sink == table checked), in the rounds; "
        f"latency: a continuous run at half its rate for {args.latency_seconds:g} s."
    )


def verdicts(results: list[Result], memory: tuple[Result, Result] | None) -> list[str]:
    def find(kind: str, latency: float | None) -> Result | None:
        return next((r for r in results if r.kind == kind and r.latency_ms == latency), None)

    lines = []
    sluice0, naive0, ceiling0 = find("sluice", 0.0), find("naive", 0.0), find("pgbench1", 0.0)
    sluice1, naive1 = find("sluice", 1.0), find("naive", 1.0)
    broadcast = find("broadcast", None)
    plain, lookup = find("ceiling-plain", None), find("ceiling-lookup", None)
    for sluice, ceiling, target, label in (
        (sluice0, plain, TARGET_VS_PLAIN_L0, "L=0 vs the no-lookup ceiling"),
        (sluice0, lookup, TARGET_VS_LOOKUP_L0, "L=0 vs the no-platform lookup job"),
        (sluice1, plain, TARGET_VS_PLAIN_L1, "L=1 ms vs the no-lookup ceiling"),
    ):
        if sluice and ceiling:
            ratio = sluice.rate / ceiling.rate
            lines.append(
                verdict_line(
                    ratio >= target,
                    f"{label}: Sluice {sluice.rate:,.0f} events/s = {ratio:.2f}x "
                    f"{ceiling.rate:,.0f} (target >= {target:g}x; medians of this invocation)",
                )
            )
        else:
            lines.append(verdict_line(None, f"{label} (not measured)"))
    orders0 = find("orders", 0.0)
    orders_ceiling = find("ceiling-orders", None)
    if orders0 and orders_ceiling:
        ratio = orders0.rate / orders_ceiling.rate
        lines.append(
            verdict_line(
                ratio >= TARGET_ORDERS_VS_CEILING,
                f"L=0: orders {orders0.rate:,.0f} rows/s = {ratio:.2f}x the orders ceiling "
                f"{orders_ceiling.rate:,.0f} rows/s (no platform; target >= "
                f"{TARGET_ORDERS_VS_CEILING:g}x)",
            )
        )
    else:
        lines.append(verdict_line(None, "L=0: orders vs the orders ceiling (not measured)"))
    if orders0 and sluice0:
        lines.append(
            verdict_line(
                None,
                f"L=0: orders {orders0.rate:,.0f} rows/s = {orders0.rate / sluice0.rate:.2f}x "
                f"the clickstream's {sluice0.rate:,.0f} events/s (informational)",
            )
        )
    if orders0 and naive0:
        lines.append(
            verdict_line(
                None,
                f"L=0: orders {orders0.rate:,.0f} rows/s = "
                f"{orders0.rate / naive0.rate:,.1f}x naive Spark (informational: two lookups, a "
                "Postgres upsert sink)",
            )
        )
    for sluice, naive, target, label in (
        (sluice0, naive0, TARGET_VS_NAIVE_L0, "L=0"),
        (sluice1, naive1, TARGET_VS_NAIVE_L1, "L=1 ms"),
    ):
        if sluice and naive:
            ratio = sluice.rate / naive.rate
            lines.append(
                verdict_line(
                    None,
                    f"{label}: Sluice {ratio:,.1f}x naive Spark (informational; the earlier "
                    f"target {target:g}x is carried by the ceiling ratios)"
                    + (" [naive rate from a prefix]" if naive.extrapolated_seconds else ""),
                )
            )
        else:
            lines.append(verdict_line(None, f"{label}: Sluice vs naive Spark (not measured)"))
    if sluice0 and ceiling0:
        lines.append(
            verdict_line(
                sluice0.rate > ceiling0.rate,
                f"L=0: Sluice {sluice0.rate:,.0f} events/s vs pgbench one-row ceiling "
                f"{ceiling0.rate:,.0f} lookups/s ({sluice0.rate / ceiling0.rate:.2f}x, "
                "target > 1x)",
            )
        )
    else:
        lines.append(
            verdict_line(None, "L=0: Sluice vs the pgbench one-row ceiling (not measured)")
        )
    if broadcast:
        for sluice, label in ((sluice0, "L=0"), (sluice1, "L=1 ms")):
            if sluice:
                ratio = sluice.seconds / broadcast.seconds
                lines.append(
                    verdict_line(
                        ratio <= TARGET_VS_BROADCAST,
                        f"{label}: Sluice wall {sluice.seconds:.1f} s = {ratio:.2f}x the "
                        f"broadcast join's {broadcast.seconds:.1f} s "
                        f"(target <= {TARGET_VS_BROADCAST:g}x)",
                    )
                )
    else:
        lines.append(verdict_line(None, "Sluice vs the broadcast join's wall time (not measured)"))
    if memory:
        small, large = memory
        if small.worker_mib and large.worker_mib:
            ratio = large.worker_mib / small.worker_mib
            lines.append(
                verdict_line(
                    ratio <= TARGET_MEMORY,
                    f"Sluice worker peak RSS {small.worker_mib:,.0f} MiB at {small.events:,} "
                    f"events, {large.worker_mib:,.0f} MiB at {large.events:,} "
                    f"({ratio:.2f}x, flat = <= {TARGET_MEMORY:g}x)",
                )
            )
    else:
        lines.append(
            verdict_line(None, "worker memory flat from 1x to 5x events (use --memory-scaling)")
        )
    return lines
