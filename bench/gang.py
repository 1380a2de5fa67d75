"""What gang scheduling costs: the same runs with the subtasks as one Spark barrier stage
(the default) and as a plain stage, interleaved, medians of ``--rounds``.

    python bench/gang.py [--events 100000] [--small 2000] [--rounds 3]

Two sizes of the clickstream example on one ``local[2]`` session (warmed up first), 2
subtasks, EXACTLY_ONCE checkpoints every second: ``--small`` events (a run's fixed costs
dominate: where the barrier stage's extra shuffle of the subtasks' results would show) and
``--events`` events. Each round runs both modes, alternating which goes first. A plain stage
is what Sluice used before: it hangs when the parallelism exceeds the task slots.
Platform database: the embedded Postgres under ``SLUICE_HOME`` (or ``SLUICE_DATABASE_URL``).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from datetime import date
from pathlib import Path

from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _harness import clickstream_over, forget_source

from enumerator_service import asyncpg_dsn, load_settings
from enumerator_service._operations import Platform, discover, open_platform
from examples._clickstream_data import DemoSpec, generate_events, load_users

console = Console(width=120)
USERS_TABLE = "bench_gang_users"
USERS = 50_000


def _one_run(platform: Platform, out: Path, landing: Path, gang: bool) -> tuple[float, int]:
    """Wall seconds of discover + run; rows in. The source is forgotten afterwards."""
    from spark_jobs.jobs import ReaderRun, run_pipeline
    from spark_jobs.pipeline._paths import discovery_of

    source = f"bench_gang_{uuid.uuid4().hex[:10]}"
    settings = platform.settings.model_copy(update={"warehouse_dir": out / source})
    pipeline = clickstream_over(landing, source, USERS_TABLE)
    ReaderRun.gang_scheduled = gang
    started = time.perf_counter()
    try:
        found = discover(
            Platform(settings, platform.url, platform.engine), discovery_of(pipeline, settings)
        )
        assert found.splits_registered > 0
        summary = run_pipeline(settings, pipeline)
        return time.perf_counter() - started, summary.rows_in
    finally:
        ReaderRun.gang_scheduled = True
        forget_source(platform.engine, source)
        shutil.rmtree(out / source, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--small", type=int, default=2_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    settings = load_settings(
        spark_master="local[2]",
        parallelism=2,
        checkpoint_interval_seconds=1.0,
        checkpointing_mode="EXACTLY_ONCE",
    )
    platform = open_platform(settings)
    work = Path(tempfile.mkdtemp(prefix="sluice-bench-gang-"))
    try:
        load_users(
            asyncpg_dsn(platform.url),
            schema="public",
            table=USERS_TABLE,
            key="id",
            users=USERS,
            seed=7,
        )
        sizes = {}
        for events in (args.small, args.events):
            landing = work / f"events-{events}"
            generate_events(landing, DemoSpec(events, 2, 4, USERS, date(2026, 1, 1), 7))
            sizes[events] = landing
        console.print("warm-up (unmeasured)…")
        _one_run(platform, work, sizes[args.small], gang=True)
        _one_run(platform, work, sizes[args.small], gang=False)
        walls: dict[tuple[int, bool], list[float]] = {}
        for events, landing in sizes.items():
            for round_ in range(args.rounds):
                order = (True, False) if round_ % 2 == 0 else (False, True)
                for gang in order:
                    wall, rows = _one_run(platform, work, landing, gang)
                    walls.setdefault((events, gang), []).append(wall)
                    mode = "barrier" if gang else "plain"
                    console.print(f"{events:>9,} events  {mode:<8} {wall:6.2f} s  {rows:,} rows")
        table = Table(
            title=f"Gang scheduling cost (medians of {args.rounds}, local[2], 2 subtasks)"
        )
        for column in ("events", "plain stage s", "barrier stage s", "barrier / plain"):
            table.add_column(column, justify="right")
        for events in sizes:
            plain = statistics.median(walls[(events, False)])
            barrier = statistics.median(walls[(events, True)])
            table.add_row(f"{events:,}", f"{plain:.2f}", f"{barrier:.2f}", f"{barrier / plain:.2f}")
        console.print(table)
    finally:
        platform.close()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
