"""Shared constants, the console and the result records of ``bench/e2e.py``."""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass
from datetime import date
from pathlib import Path
from typing import Any

from rich.console import Console

from enumerator_service._operations import Platform

console = Console(width=220)  # the result table has 14 columns

MASTER = "local[2]"
CORES = 2
USERS_TABLE = "bench_e2e_users"
SEED = 7
START = date(2026, 1, 1)
JDBC_JAR = Path("/usr/share/java/postgresql.jar")
VARIANTS = (
    "sluice",
    "small",
    "orders",
    "s3",
    "discovery",
    "iceberg",
    "delta",
    "cache",
    "compaction",
    "cdc",
    "kafka",
    "naive",
    "broadcast",
    "pgbench",
    "ceiling",
)
USER_COLUMNS = ("name", "country", "tier", "signup_time")
EVENT_SCHEMA = (
    "event_id STRING, user_id BIGINT, event_time TIMESTAMP, event_type STRING, amount DOUBLE"
)
OUTPUT_SCHEMA = (
    f"{EVENT_SCHEMA}, user_name STRING, user_country STRING, user_tier STRING, "
    "user_signup_time TIMESTAMP, dt DATE"
)
REQUIRED = ("event_id", "user_id", "event_time", "event_type", "amount")

# Targets (ratios from this run only).
# Issue 22: the ratios to naive Spark are informational (naive Spark runs 5-33k events/s
# depending on the machine; 20x / 100x cannot hold on a 2-core machine): the ceiling ratios
# carry the goal. Shown for comparison with earlier issues' targets.
TARGET_VS_NAIVE_L0 = 20.0  # issue 15 (was 7x); informational since issue 22
# Issue 15: Sluice's rate over the ceilings of the same invocation, at least.
TARGET_VS_PLAIN_L0 = 0.30  # the no-lookup ceiling (read, parse, write), L = 0
TARGET_VS_PLAIN_L1 = 0.25  # the same, L = 1 ms
TARGET_VS_LOOKUP_L0 = 0.6  # the no-platform lookup job, L = 0
# Issue 22: the orders example at L=0 over the orders ceiling (the same lookups, map, filter
# and upsert without the platform), at least (was: 0.5x the clickstream's rate).
TARGET_ORDERS_VS_CEILING = 0.9
TARGET_VS_NAIVE_L1 = 100.0  # informational since issue 22
TARGET_VS_BROADCAST = 1.5  # Sluice wall time / broadcast join wall time, at most
TARGET_MEMORY = 1.2  # worker peak at 5x the events / at 1x, at most ("flat")
# Issue 22, files anywhere: the clickstream with landing + warehouse on the local S3 server
# over the local-disk rate, and discovery of 100,000 objects over a bare pyarrow.fs listing of
# the same prefix, at least (bench/_e2e_s3.py, bench/s3_discovery.py).
TARGET_S3_VS_LOCAL = 0.7
TARGET_DISCOVERY_VS_LISTING = 0.5
# Lakehouse sinks (bench/_e2e_lakehouse.py): the clickstream into Iceberg and into Delta over
# the same run into the Parquet sink (L=0, medians of the rounds), at least; Iceberg's
# checkpoint p50 over the Parquet run's, at most; compaction of a day over a bare PyIceberg
# read + overwrite of the same day (rate = rows of the day / wall s), at least.
TARGET_LAKEHOUSE_VS_PARQUET = 0.85
TARGET_CHECKPOINT_VS_PARQUET = 2.0
TARGET_COMPACTION_VS_BARE = 0.5


# -- results ---------------------------------------------------------------------------


@dataclass
class Result:
    latency_ms: float | None  # None: latency-independent (measured once)
    kind: str  # sluice | naive | broadcast | pgbench1 | pgbench100
    variant: str
    events: int  # rows (or lookups) measured
    seconds: float  # wall time of what was measured
    rate: float  # rows (or lookups) per second
    cpu: float | None = None
    worker_mib: float | None = None
    driver_mib: float | None = None
    note: str = ""
    extrapolated_seconds: float | None = None  # naive prefix: the full input at this rate
    worker_rss: list[float] | None = None  # the largest worker's RSS at 0, 25, .., 100 %
    postgres_cpu: float | None = None  # CPU seconds of the database server (when local)
    # Sluice runs: the run summary's checkpoint p50 (triggered -> completed in Postgres; the
    # sink's publish, e.g. an Iceberg or Delta commit, runs after and is not in it). In a
    # median_of row: the median of the rounds' values.
    checkpoint_p50_ms: float | None = None
    # Sluice runs with a cache: the measured hit rate (and bypassed share), for the verdicts.
    cache_note: str = ""
    # In a median_of row: the median over the rounds of CPU + postgres_cpu (the CPU a run
    # costs is far steadier between rounds than its rate on a shared machine).
    total_cpu_median: float | None = None
    # A Sluice run that left part of its input unread (e.g. a split back in the pool after a
    # failed attempt): its rate is not the files'; median_of leaves it out when it can.
    partial: bool = False


@dataclass
class Context:
    args: argparse.Namespace
    platform: Platform
    landing: Path
    files: list[Path]
    events: int  # lines in the files (malformed ones included)
    out_root: Path
    spark: Any = None
    orders: Path | None = None  # the orders example's landing folder


def median_of(runs: list[Result]) -> Result:
    """The run of median rate (of an even count, the lower one), its note saying so. Runs
    that left input unread (``partial``) are left out unless every run did."""
    complete = [r for r in runs if not r.partial] or runs
    skipped = len(runs) - len(complete)
    runs = complete
    ordered = sorted(runs, key=lambda r: r.rate)
    median = dataclasses.replace(ordered[(len(ordered) - 1) // 2])
    p50s = sorted(r.checkpoint_p50_ms for r in runs if r.checkpoint_p50_ms is not None)
    if p50s:
        median.checkpoint_p50_ms = p50s[(len(p50s) - 1) // 2]
    totals = sorted((r.cpu or 0.0) + (r.postgres_cpu or 0.0) for r in runs if r.cpu is not None)
    if totals:
        median.total_cpu_median = totals[(len(totals) - 1) // 2]
    if len(runs) > 1:
        rates = " / ".join(f"{r.rate:,.0f}" for r in runs)
        median.note = f"median of {len(runs)} rounds ({rates}/s); {median.note}"
    if skipped:
        median.note = f"{skipped} partial round(s) left out; {median.note}"
    return median


def mib(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f}"
