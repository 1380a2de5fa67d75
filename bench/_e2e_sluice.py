"""``bench/e2e.py``: the Sluice runs (clickstream, orders) and the py-spy profile."""

from __future__ import annotations

import dataclasses
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from _e2e_common import (
    CORES,
    MASTER,
    USERS_TABLE,
    Context,
    Result,
    console,
)
from _e2e_pgcpu import breakdown
from _e2e_procs import MemorySampler, _cmdline, _descendants, _process_table, timed_run
from _harness import clickstream_over, drop_sink_tables, forget_source

from enumerator_service import Settings, StorageOptions, load_settings, open_location
from enumerator_service._operations import Platform, discover

# -- 1. Sluice -------------------------------------------------------------------------


def sluice_settings(
    ctx: Context, latency_ms: float, source: str, warehouse: str | None = None
) -> Settings:
    """The bench's settings; the output under ``warehouse`` (a URI, e.g. ``s3://b/wh``) or
    under the bench's local folder."""
    return load_settings(
        spark_master=MASTER,
        parallelism=CORES,
        warehouse_dir=f"{warehouse}/{source}" if warehouse else ctx.out_root / source,
        checkpoint_interval_seconds=1.0,
        checkpointing_mode="EXACTLY_ONCE",
        lookup_injected_latency_ms=latency_ms,
    )


def clickstream_pipeline(landing: Path | str, source: str, cache_rows: int) -> Any:
    """The clickstream example over the bench's files and users table (no cache by default:
    with these uniformly random keys a cache hits ~9 % and costs more than it saves)."""
    from spark_jobs import PartialCache

    cache = PartialCache(cache_rows) if cache_rows else None
    return clickstream_over(landing, source, USERS_TABLE, cache)


def run_sluice(
    ctx: Context,
    latency_ms: float,
    landing: Path | str | None = None,
    label: str = "",
    cache_rows: int | None = None,
    kind: str | None = None,
    warehouse: str | None = None,
    sink: Any = None,
    source: str | None = None,
    verify: Callable[[Settings, Any], None] | None = None,
) -> Result:
    """The clickstream example over ``landing`` (a folder or a URI; default: the bench's
    files), its output under ``warehouse`` (default: the bench's local folder), written by
    ``sink`` (default: the example's Parquet sink), as the pipeline ``source`` (default: a
    fresh name). ``verify(settings, summary)``, not timed, runs before the output is removed
    (e.g. a lakehouse sink's committed row count against ``summary.rows_out``)."""
    landing = landing or ctx.landing
    source = source or f"bench_e2e_{uuid.uuid4().hex[:10]}"
    cache = ctx.args.cache_rows if cache_rows is None else cache_rows
    settings = sluice_settings(ctx, latency_ms, source, warehouse)
    pipeline = clickstream_pipeline(landing, source, cache)
    if sink is not None:
        pipeline = dataclasses.replace(pipeline, sink=sink)
    summary, wall, cpu, memory = _run_pipeline(ctx, settings, pipeline, verify)
    # The bench's files, or a cache row's copy of them (the same lines): every line is a row
    # or a dead letter.
    expected = ctx.events if landing is ctx.landing or cache_rows is not None else None
    partial = _partial(summary, expected)
    note = (
        partial + f"{summary.checkpoints} ckpts (p50 {summary.checkpoint_p50_ms:.0f} ms), "
        f"{summary.lookup_queries:,} queries, {summary.cache_hit_rate:.1%} cache hits "
        f"({summary.cache_bypass_rate:.0%} bypassed), "
        f"{summary.dead_letters:,} dead letters; {cpu_breakdown(memory.cpu_by)}; "
        f"{breakdown(memory.postgres_cpu_by)}"
    )
    return Result(
        latency_ms,
        kind or ("sluice" if cache_rows is None else "sluice-cached"),
        label or "Sluice",
        summary.rows_in,
        wall,
        summary.rows_in / wall,
        cpu,
        memory.worker_mib,
        memory.driver_mib,
        note,
        worker_rss=memory.worker_profile(),
        postgres_cpu=memory.postgres_cpu,
        checkpoint_p50_ms=summary.checkpoint_p50_ms,
        partial=bool(partial),
        cache_note=(
            f"{summary.cache_hit_rate:.1%} hits of the keys the cache was asked, "
            f"{summary.cache_bypass_rate:.0%} of keys bypassed it"
        ),
    )


_LAST_DISCOVERY: list[Any] = []


def _partial(summary: Any, expected_lines: int | None) -> str:
    """'' when the run read all its input; else what it left (its rate is not the files')."""
    left = summary.left
    lines = summary.rows_in + summary.dead_letters
    short = expected_lines is not None and lines < expected_lines
    if not left.unread and not left.quarantined and not short:
        return ""
    found = _LAST_DISCOVERY[0] if _LAST_DISCOVERY else None
    given = (
        ""
        if found is None
        else f"discovery: {found.files_seen} files, {found.splits_registered} splits registered, "
        f"{found.backlog_files} in backlog, {found.unsettled_files} unsettled; "
    )
    return (
        f"PARTIAL: {given}{lines:,} lines of {expected_lines or 0:,}, "
        f"{summary.splits} splits read, {left.unread} left unread (held {left.held}, "
        f"retrying {len(left.retrying)}), "
        f"{len(left.quarantined)} quarantined; "
    )


def cpu_breakdown(seconds: dict[str, float]) -> str:
    """``CPU s: worker 6.5, driver 1.0, jvm 0.3; others 5.2`` (this process and its
    descendants by kind; ``others``: the rest of the machine meanwhile, i.e. the load the run
    competed with — what makes two runs of the same code differ on a shared machine)."""
    own = {kind: value for kind, value in seconds.items() if kind != "others"}
    parts = sorted(own.items(), key=lambda kv: -kv[1])
    text = "CPU s: " + ", ".join(f"{kind} {value:.1f}" for kind, value in parts if value >= 0.05)
    return text + (f"; others {seconds['others']:.1f}" if "others" in seconds else "")


def _run_pipeline(
    ctx: Context,
    settings: Settings,
    pipeline: Any,
    verify: Callable[[Settings, Any], None] | None = None,
) -> tuple[Any, float, float, MemorySampler]:
    """(summary, wall, CPU, memory) of discovering and running ``pipeline``; ``verify``
    (untimed) sees the output; its splits and output are forgotten afterwards."""
    from spark_jobs.jobs import run_pipeline
    from spark_jobs.pipeline._paths import discovery_of

    platform = Platform(settings, ctx.platform.url, ctx.platform.engine)

    def run() -> Any:
        found = discover(platform, discovery_of(pipeline, settings))
        assert found.splits_registered > 0, "no splits registered"
        _LAST_DISCOVERY[:] = [found]  # for a PARTIAL note: what the run was given
        return run_pipeline(settings, pipeline)

    try:
        wall, cpu, memory, summary = timed_run(run)
        if verify is not None:
            verify(settings, summary)
    finally:
        forget_source(ctx.platform.engine, pipeline.name)
        output = open_location(settings.warehouse_uri, StorageOptions.of(settings))
        if output.object_store:
            output.fs.delete_dir(output.path)
        else:
            shutil.rmtree(output.local_path, ignore_errors=True)
    assert summary.fenced == 0 and summary.rows_in > 0, summary
    return summary, wall, cpu, memory


def run_orders(ctx: Context, latency_ms: float) -> Result:
    """The orders example over the bench's orders files (rows in = orders read)."""

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
        drop_sink_tables(ctx.platform.engine, "public", [table])
    note = (
        f"{summary.checkpoints} ckpts (p50 {summary.checkpoint_p50_ms:.0f} / p99 "
        f"{summary.checkpoint_p99_ms:.0f} ms), {summary.lookup_queries:,} queries, "
        f"{summary.dropped:,} filtered, {summary.dead_letters:,} dead letters; "
        f"{breakdown(memory.postgres_cpu_by)}"
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
        postgres_cpu=memory.postgres_cpu,
    )


# -- profile ---------------------------------------------------------------------------


def profile_sluice(ctx: Context, path: Path, pipeline: str = "clickstream") -> None:
    """One unmeasured run of ``pipeline`` (clickstream or orders) at L=0 under ``py-spy
    record`` of the Python daemon and all of its workers."""
    py_spy = Path(sys.executable).with_name("py-spy")
    table = _process_table()
    daemons = [
        pid
        for pid in _descendants(table)
        if "-m spark_jobs._daemon" in _cmdline(pid) and table[table[pid][0]][1] == "java"
    ]
    if not py_spy.exists() or not daemons:
        console.print(
            f"profile skipped: py-spy {py_spy} or the Python daemon not found "
            "(py-spy: .venv/bin/pip install py-spy)"
        )
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
        if pipeline == "orders":
            result = run_orders(ctx, 0.0)
        else:
            result = run_sluice(ctx, 0.0, label="Sluice under py-spy (not measured)")
    finally:
        recorder.send_signal(signal.SIGINT)
        _out, err = recorder.communicate(timeout=120)
    console.print(
        f"profile: {path} ({result.rate:,.0f} rows/s under py-spy, {result.seconds:.1f} s, "
        f"Postgres {result.postgres_cpu or 0:.1f} CPU s)"
        + (
            f"; py-spy exited with {recorder.returncode}: {err.decode(errors='replace')[-600:]}"
            if recorder.returncode
            else ""
        )
    )
