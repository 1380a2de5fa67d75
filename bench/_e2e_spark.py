"""``bench/e2e.py``: the Spark baselines (naive per-row lookups, a broadcast join)."""

from __future__ import annotations

import contextlib
import functools
import math
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from _e2e_common import (
    CORES,
    EVENT_SCHEMA,
    JDBC_JAR,
    MASTER,
    OUTPUT_SCHEMA,
    REQUIRED,
    USER_COLUMNS,
    USERS_TABLE,
    Context,
    Result,
    console,
)
from _e2e_data import count_lines
from _e2e_procs import timed_run
from sqlalchemy.engine import make_url

from enumerator_service import asyncpg_dsn

# -- 2 and 3. Spark baselines ----------------------------------------------------------


def naive_partition(dsn: str, table: str, latency: float, rows: Iterator[Any]) -> Iterator[Any]:
    """What most Spark users write: one connection per partition, one query per row."""

    import psycopg

    sql = f"SELECT name, country, tier, signup_time FROM public.{table} WHERE id = %s"
    missing = (None, None, None, None)
    with psycopg.connect(dsn) as conn, conn.cursor() as cur:
        for row in rows:
            if latency:
                time.sleep(latency)
            cur.execute(sql, (row.user_id,), prepare=True)
            user = cur.fetchone()
            yield (*row[:5], *(user or missing), row.dt)


def read_events(ctx: Context, files: list[Path]) -> Any:
    """The events as a DataFrame (with the ``dt`` partition column), in >= 16 partitions."""
    total = sum(f.stat().st_size for f in files)
    ctx.spark.conf.set("spark.sql.files.maxPartitionBytes", str(max(1 << 20, total // 16)))
    frame = (
        ctx.spark.read.schema(EVENT_SCHEMA)
        .option("basePath", str(ctx.landing))
        .json([str(f) for f in files])
    )
    return frame.dropna(subset=list(REQUIRED))


def naive_prefix(ctx: Context, latency_ms: float, naive_l0: Result | None) -> list[Path]:
    """All files at L=0; at L > 0 a prefix sized to ``--naive-seconds`` (an even count)."""
    if latency_ms == 0:
        return ctx.files
    per_row = CORES / naive_l0.rate if naive_l0 else 2e-4  # seconds per row per core at L=0
    expected = CORES / (per_row + latency_ms / 1000 * 1.08)  # time.sleep overshoots a little
    per_file = ctx.events / len(ctx.files)
    wanted = math.ceil(expected * ctx.args.naive_seconds / per_file / CORES) * CORES
    return ctx.files[: max(CORES, min(len(ctx.files), wanted))]


def run_naive(ctx: Context, latency_ms: float, naive_l0: Result | None) -> Result:
    files = naive_prefix(ctx, latency_ms, naive_l0)
    events = ctx.events if files == ctx.files else count_lines(files)
    out = ctx.out_root / f"naive-{uuid.uuid4().hex[:8]}"
    dsn = asyncpg_dsn(ctx.platform.url)

    def job() -> int:
        frame = read_events(ctx, files)
        rdd = frame.rdd.mapPartitions(
            functools.partial(naive_partition, dsn, USERS_TABLE, latency_ms / 1000)
        )
        ctx.spark.createDataFrame(rdd, OUTPUT_SCHEMA).write.partitionBy("dt").parquet(str(out))
        return int(frame.rdd.getNumPartitions())

    try:
        wall, cpu, memory, partitions = timed_run(job)
        written = ctx.spark.read.parquet(str(out)).count()
    finally:
        ctx.spark.conf.unset("spark.sql.files.maxPartitionBytes")
        shutil.rmtree(out, ignore_errors=True)
    rate = events / wall
    result = Result(
        latency_ms,
        "naive",
        "naive Spark",
        events,
        wall,
        rate,
        cpu,
        memory.worker_mib,
        memory.driver_mib,
        f"{partitions} partitions, {written:,} rows out",
        postgres_cpu=memory.postgres_cpu,
    )
    if files != ctx.files:
        result.variant += " (prefix, extrapolated)"
        result.extrapolated_seconds = ctx.events / rate
        result.note = f"first {len(files)} files; " + result.note
    return result


class UnixRelay:
    """127.0.0.1:<ephemeral port> relayed to a Unix socket: for the JDBC driver, which cannot
    open Unix sockets itself (pgjdbc needs junixsocket for that). Two threads per connection."""

    def __init__(self, socket_path: str) -> None:
        self._path = socket_path
        self._server = socket.create_server(("127.0.0.1", 0))
        self.port = self._server.getsockname()[1]
        self._closed = False
        threading.Thread(target=self._accept, name="jdbc-relay", daemon=True).start()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _addr = self._server.accept()
            except OSError:
                return
            upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            upstream.connect(self._path)
            for src, dst in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(src, dst), daemon=True).start()

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(1 << 18):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (src, dst):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        self._closed = True
        self._server.close()


def jdbc_target(url: str) -> tuple[str, dict[str, str], UnixRelay | None]:
    """(JDBC URL, properties, relay to close) for the platform database."""
    parsed = make_url(url)
    props = {"user": parsed.username or "postgres", "driver": "org.postgresql.Driver"}
    if parsed.password:
        props["password"] = str(parsed.password)
    host = parsed.host or str(parsed.query.get("host") or "")
    relay = None
    if host.startswith("/"):
        relay = UnixRelay(f"{host}/.s.PGSQL.{parsed.port or 5432}")
        address = f"127.0.0.1:{relay.port}"
    else:
        address = f"{host}:{parsed.port or 5432}"
    return f"jdbc:postgresql://{address}/{parsed.database or 'postgres'}", props, relay


def run_broadcast(ctx: Context) -> Result:
    from pyspark.sql import functions as F

    jdbc_url, props, relay = jdbc_target(ctx.platform.url)
    out = ctx.out_root / f"broadcast-{uuid.uuid4().hex[:8]}"

    def job() -> None:
        reader = ctx.spark.read.format("jdbc").option("url", jdbc_url)
        for key, value in props.items():
            reader = reader.option(key, value)
        users = (
            reader.option("dbtable", f"public.{USERS_TABLE}")
            .option("partitionColumn", "id")
            .option("lowerBound", 1)
            .option("upperBound", ctx.args.users + 1)
            .option("numPartitions", CORES)
            .option("fetchsize", 10_000)
            .load()
            .select(
                F.col("id"),
                *(F.col(c).alias(f"user_{c}") for c in USER_COLUMNS),
            )
        )
        events = read_events(ctx, ctx.files)
        joined = events.join(F.broadcast(users), events.user_id == users.id, "left").drop("id")
        joined.write.partitionBy("dt").parquet(str(out))

    try:
        wall, cpu, memory, _ = timed_run(job)
        written = ctx.spark.read.parquet(str(out)).count()
    finally:
        ctx.spark.conf.unset("spark.sql.files.maxPartitionBytes")
        shutil.rmtree(out, ignore_errors=True)
        if relay is not None:
            relay.close()
    return Result(
        None,
        "broadcast",
        "Spark broadcast join",
        ctx.events,
        wall,
        ctx.events / wall,
        cpu,
        memory.worker_mib,
        memory.driver_mib,
        f"{written:,} rows out; JDBC" + (" via the 127.0.0.1 relay" if relay else ""),
        postgres_cpu=memory.postgres_cpu,
    )


JDBC_PACKAGE = "libpostgresql-jdbc-java"


def ensure_jdbc_driver() -> str | None:
    """Install Debian's JDBC driver if it is missing; None when present, else why not.

    As ``.ci/run`` installs chromium: only as root with apt-get, non-interactively, without
    recommended packages, with one ``apt-get update`` and retry if the first try fails. Blocks
    (minutes at most).
    """
    if JDBC_JAR.exists():
        return None
    how = f"install Debian's {JDBC_PACKAGE} (apt-get install {JDBC_PACKAGE}) for {JDBC_JAR}"
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        return f"broadcast join: no JDBC driver at {JDBC_JAR} and no root apt-get here: {how}"
    install = ["apt-get", "install", "-y", "-q", "--no-install-recommends", JDBC_PACKAGE]
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    console.print(f"Installing {JDBC_PACKAGE} for the broadcast-join row…")
    for attempt in ([install], [["apt-get", "update", "-q"], install]):
        done = [subprocess.run(c, env=env, capture_output=True, check=False) for c in attempt]
        if JDBC_JAR.exists():
            return None
        error = done[-1].stderr.decode(errors="replace").strip().splitlines()
    last = error[-1] if error else "no error output"
    return f"broadcast join: could not install {JDBC_PACKAGE} ({last}); {how}"


def start_spark(jdbc: bool) -> Any:
    from spark_jobs._spark import get_spark

    if jdbc and "PYSPARK_SUBMIT_ARGS" not in os.environ:
        os.environ["PYSPARK_SUBMIT_ARGS"] = (
            f"--jars {JDBC_JAR} --driver-class-path {JDBC_JAR} pyspark-shell"
        )
    from pyspark import cloudpickle

    # The workers cannot import this module (bench/ is not on their path): ship naive
    # Spark's partition function by value, as it was while it lived in the script.
    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    spark = get_spark(MASTER)
    # Start the Python daemon and one worker per core before anything is measured.
    spark.sparkContext.parallelize(range(CORES), CORES).map(lambda x: x).collect()
    return spark
