"""``bench/e2e.py``: the CDC latency row — commit to visible in the sink, continuous run.

A fresh table (1,000 rows) and pipeline as the CDC rows' (``_e2e_cdc.cdc_pipeline``: lookup,
Postgres upsert sink), run continuously (``run_pipeline(continuous=True)`` in a thread, fed by
discover + assign as the continuous sensor does). Once its stream split is being read, a
writer on this thread commits inserts of increasing ids at ``rate`` rows/s (one transaction
per ``TICK``) for ``seconds``; a poller thread (``_e2e_latency.Poller``) reads ``max(id)`` of
the sink every ``POLL`` s.
A row's latency = the first poll that saw an id >= its transaction's last id minus the
moment its COMMIT returned (one clock, ``time.monotonic``; the poll period adds up to
``POLL``). The run is then cancelled, the sink compared with the table, everything dropped.

Threading: the run and the poller are daemon threads of this module; ``measure_cdc_latency``
joins both before it returns.
"""

from __future__ import annotations

import os
import secrets
import threading
import time
from typing import Any

import sqlalchemy as sa
from _e2e_cdc_tables import cdc_pipeline, create_orders, sink_diff
from _e2e_common import Context
from _e2e_latency import POLL, Latency, Poller
from _e2e_sluice import sluice_settings
from _harness import drop_sink_tables, forget_source

from enumerator_service import SplitStore, asyncpg_dsn, splits
from enumerator_service._operations import Platform, discover

__all__ = ["measure_cdc_latency"]

TICK = 0.1  # one writer transaction per tick
START_TIMEOUT = 180.0  # until the stream split is read (snapshot, sensor-like discovery)
CATCH_UP = 60.0


class _High:
    """``(monotonic time, max(id))`` of ``<table>_out`` per look (a ``Poller``'s)."""

    def __init__(self, engine: sa.Engine, table: str) -> None:
        self.engine, self.table = engine, table
        self.seen: list[tuple[float, int]] = []

    def look(self, now: float) -> None:
        with self.engine.connect() as conn:  # a fresh snapshot per look
            high = conn.execute(sa.text(f"SELECT coalesce(max(id), 0) FROM {self.table}_out"))
            self.seen.append((now, int(high.scalar_one())))

    def latest(self) -> int:
        return self.seen[-1][1] if self.seen else 0


def _stream_reading(engine: sa.Engine, source: str) -> bool:
    with engine.connect() as conn:
        return bool(
            conn.execute(
                sa.select(sa.func.count()).where(
                    splits.c.source == source,
                    splits.c.kind == "pgcdc",
                    splits.c.status == "READING",
                )
            ).scalar_one()
        )


def _write(url: str, table: str, first: int, rate: float, seconds: float, users: int) -> list:
    """Insert ``rate`` rows/s for ``seconds``; ``(last id, commit time, rows)`` per commit."""
    import psycopg

    per = max(1, round(rate * TICK))
    commits: list[tuple[int, float, int]] = []
    with psycopg.connect(url, autocommit=True) as conn:
        start = time.monotonic()
        for tick in range(int(seconds / TICK)):
            time.sleep(max(0.0, start + tick * TICK - time.monotonic()))
            low = first + tick * per
            conn.execute(
                f"INSERT INTO {table} SELECT g, 1 + g %% %s, 'new', 1 "
                "FROM generate_series(%s::bigint, %s::bigint) g",
                (users, low, low + per - 1),
            )
            commits.append((low + per - 1, time.monotonic(), per))
    return commits


def _samples(commits: list[tuple[int, float, int]], seen: list[tuple[float, int]]) -> list:
    samples: list[float] = []
    polls = iter(seen)
    at, high = next(polls, (0.0, 0))
    for last, committed, rows in commits:  # both in increasing order
        while high < last or at < committed:
            at, high = next(polls, (float("inf"), 1 << 62))
        samples += [at - committed] * rows
    return samples


def measure_cdc_latency(ctx: Context, rate: float, seconds: float) -> Latency:
    """Commit -> visible latency of a continuous CDC run at ``rate`` changes/s."""
    from spark_jobs.connectors.postgres_cdc import drop_slot
    from spark_jobs.jobs import run_pipeline
    from spark_jobs.pipeline._paths import discovery_of

    engine = ctx.platform.engine
    name = f"bench_cdclat_{secrets.token_hex(4)}"
    table, run_id = f"public.{name}", f"{name}-c1"
    settings = sluice_settings(ctx, 0.0, name).model_copy(
        update={"continuous_poll_seconds": 0.2, "continuous_idle_seconds": 0}
    )
    pipeline = cdc_pipeline(name, table, 500)
    options = pipeline.plan.source.options
    platform = Platform(settings, ctx.platform.url, engine)
    store = SplitStore(engine)
    outcome: dict[str, Any] = {}

    def reader() -> None:
        try:
            outcome["summary"] = run_pipeline(settings, pipeline, run_id=run_id, continuous=True)
        except BaseException as exc:  # the cancel at the end; shown if it came earlier
            outcome["error"] = exc

    run = threading.Thread(target=reader, name="cdc-latency-run", daemon=True)
    high = _High(engine, table)
    poller = Poller("cdc-latency-poller", high.look, time.monotonic)
    try:
        create_orders(engine, table, 1_000, ctx.args.users)
        deadline = time.monotonic() + START_TIMEOUT
        while not _stream_reading(engine, name):  # what the continuous sensor does per tick
            discover(platform, discovery_of(pipeline, settings))
            store.assign_to_run(run_id, name, lease_seconds=settings.lease_seconds)
            if not run.is_alive():
                assert "error" not in outcome, outcome
                run.start()
            assert time.monotonic() < deadline, "the CDC stream split was never read"
            time.sleep(0.5)
        time.sleep(2.0)  # the snapshot's last checkpoint out of the way
        poller.start()
        url = asyncpg_dsn(ctx.platform.url)
        commits = _write(url, table, 100_000, rate, seconds, ctx.args.users)
        poller.catch_up(lambda: high.latest() >= commits[-1][0], run, outcome, CATCH_UP)
        load = os.getloadavg()
        diff = sink_diff(engine, table)
        assert not diff, f"CDC latency run: the sink differs from the table: {diff}"
    finally:
        poller.stop.set()
        ctx.spark.sparkContext.cancelAllJobs()
        run.join(60)
        drop_slot(engine, options.slot, options.publication)
        forget_source(engine, name)
        with engine.begin() as conn:
            conn.execute(sa.text(f"DROP TABLE IF EXISTS {table}"))
        drop_sink_tables(engine, "public", [f"{table}_out"])
    offered = sum(rows for _, _, rows in commits)
    return Latency(
        "CDC latency: commit -> visible in the Postgres sink (continuous run)",
        _samples(commits, high.seen),
        offered / seconds,
        seconds,
        settings.checkpoint_interval_seconds,
        load,
        note=f"inserts in one transaction per {TICK:g} s, sink polled every {POLL:g} s",
    )
