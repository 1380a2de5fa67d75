"""Checkpoint benchmark: the reader job with barrier checkpoints every second vs. without.

    python bench/checkpoint.py [--events 400000] [--users 200000] [--repeat 5] [--quick]

Runs the clickstream example pipeline (``run_pipeline``: local Spark, ``--parallelism``
reader subtasks, async lookups, Parquet sink) on the platform database of
``load_settings()`` (the embedded Postgres by default). The events (JSON Lines over several
files) and the users table (``public.bench_checkpoint_users``) are generated once and cached under
``<home>/bench/checkpoint``. Every run registers the same landing files under a source of its
own (``bench_ckpt_<random>``), so each run processes all of them; its splits, checkpoints and
output are deleted afterwards.

Variants, interleaved within each of ``--repeat`` rounds (the order alternates per round):

* ``off``: ``checkpoint_interval_seconds=0`` — no periodic checkpoint, only the final one
  when a subtask's input ends (the baseline);
* ``1 s EXACTLY_ONCE``: aligned barriers, two-phase commit every second (the target: at least
  0.9x the baseline's throughput);
* ``1 s AT_LEAST_ONCE``: informational.

events/s is rows in / the job's processing time (assignment of the splits to the last
completed checkpoint, from Postgres), best of the rounds; the ratio is against the best
baseline of this invocation. Checkpoint duration (trigger to completion), last ack (trigger
to the last subtask's acknowledgement: what the subtasks take; the rest is the coordinator
noticing and committing) and alignment (first to last acknowledgement of a checkpoint) are
pooled over every round of a variant (acknowledgement times are the start of the ack
transaction). CPU s/run is the CPU time of this process and its descendants (Spark JVM,
Python workers; not Postgres) per run, the median over the rounds, with the median of the
per-round ratios to the baseline: what checkpointing costs, less sensitive than throughput to
other load on the machine.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import time
import uuid
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from _harness import (  # bench/ is on sys.path when run as a script
    clickstream_over,
    forget_source,
    timed,
)
from rich.console import Console
from rich.table import Table

from enumerator_service import Settings, asyncpg_dsn, load_settings
from enumerator_service._operations import Platform, discover, open_platform
from enumerator_service._schema import (
    checkpoint_acks,
    checkpoints,
    splits,
)
from examples._clickstream_data import DemoSpec, generate_events, load_users

console = Console(width=170)

TARGET = 0.9  # 1 s EXACTLY_ONCE vs. checkpointing off
USERS_TABLE = "bench_checkpoint_users"
START = date(2026, 1, 1)
SEED = 7


@dataclass(frozen=True)
class Variant:
    label: str
    interval: float
    mode: str
    target: float | None


VARIANTS = (
    Variant("off (final checkpoint only)", 0.0, "EXACTLY_ONCE", None),
    Variant("1 s, EXACTLY_ONCE", 1.0, "EXACTLY_ONCE", TARGET),
    Variant("1 s, AT_LEAST_ONCE (info)", 1.0, "AT_LEAST_ONCE", None),
)


@dataclass
class Runs:
    """Every measured run of one variant."""

    rates: list[float] = field(default_factory=list)
    wall: list[float] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)
    completed: int = 0
    aborted: int = 0
    durations_ms: list[float] = field(default_factory=list)
    acks_ms: list[float] = field(default_factory=list)
    alignments_ms: list[float] = field(default_factory=list)


def quantile(values: list[float], q: float) -> float:
    """Nearest rank, like the driver's RunSummary quantiles."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def prepare_data(settings: Settings, platform: Platform, args: argparse.Namespace) -> Path:
    spec = DemoSpec(
        events=args.events,
        days=args.days,
        files_per_day=args.files_per_day,
        users=args.users,
        start_date=START,
        seed=SEED,
    )
    root = settings.home_path / "bench" / "checkpoint"
    landing = root / f"landing-e{spec.events}-u{spec.users}-d{spec.days}x{spec.files_per_day}"
    with console.status(f"Events: {spec.events:,} in {landing} (cached)…"):
        generated = generate_events(landing, spec)
    with console.status(f"Users: {args.users:,} rows in public.{USERS_TABLE} (cached)…"):
        load_users(
            asyncpg_dsn(platform.url),
            schema="public",
            table=USERS_TABLE,
            key="id",
            users=args.users,
            seed=SEED,
        )
    console.print(
        f"data: {generated.events:,} events ({generated.malformed} malformed) in "
        f"{generated.files} files{' (cached)' if generated.skipped else ''}, "
        f"{args.users:,} users"
    )
    return landing


@dataclass(frozen=True)
class Measured:
    rows_in: int
    seconds: float  # assignment → last completed checkpoint
    wall: float  # the whole run_pipeline call
    cpu: float  # CPU seconds of this process and its descendants (Spark JVM, Python workers)
    completed: int
    aborted: int
    durations_ms: list[float]
    acks_ms: list[float]  # trigger → last acknowledgement
    alignments_ms: list[float]
    summary: Any


def run_once(
    base: dict[str, Any],
    platform: Platform,
    variant: Variant,
    dates: list[date] | None = None,
) -> Measured:
    from spark_jobs.connectors.parquet import output_path
    from spark_jobs.jobs import run_pipeline  # imports pyspark
    from spark_jobs.pipeline._paths import discovery_of

    source = f"bench_ckpt_{uuid.uuid4().hex[:10]}"
    options = dict(base)
    landing = options.pop("landing")
    settings = load_settings(
        **options,
        checkpoint_interval_seconds=variant.interval,
        checkpointing_mode=variant.mode,
    )
    pipeline = clickstream_over(landing, source, USERS_TABLE)
    try:
        spec = discovery_of(pipeline, settings)
        found = discover(Platform(settings, platform.url, platform.engine), spec)
        assert found.splits_registered > 0, "no splits registered"
        cpu = cpu_seconds()
        wall, summary = timed(lambda: run_pipeline(settings, pipeline, dates=dates))
        cpu = cpu_seconds() - cpu
        assert summary.splits > 0 and summary.fenced == 0, summary
        return measure(platform.engine, summary, wall, cpu)
    finally:
        cleanup(platform.engine, source, output_path(pipeline, settings))


def cpu_seconds() -> float:
    """CPU time of this process (driver, coordinator) and of all its descendants (the Spark
    JVM, the Python daemon and its workers; exited workers count through their parent's
    cutime). Postgres is not included. NaN where there is no /proc."""
    try:
        entries = [e for e in os.scandir("/proc") if e.name.isdigit()]
    except OSError:
        return float("nan")
    children: dict[int, list[int]] = defaultdict(list)
    ticks: dict[int, int] = {}
    for entry in entries:
        try:
            stat = Path(entry.path, "stat").read_text()
        except OSError:
            continue  # exited meanwhile
        fields = stat[stat.rindex(")") + 2 :].split()
        children[int(fields[1])].append(int(entry.name))
        ticks[int(entry.name)] = sum(int(f) for f in fields[11:15])  # u, s, cu, cs time
    total, todo = 0, list(children[os.getpid()])
    while todo:
        pid = todo.pop()
        total += ticks.get(pid, 0)
        todo.extend(children[pid])
    return time.process_time() + total / os.sysconf("SC_CLK_TCK")


def measure(engine: sa.Engine, summary: Any, wall: float, cpu: float) -> Measured:
    run_id = summary.run_id
    with engine.connect() as conn:
        started = conn.execute(
            sa.select(sa.func.min(splits.c.assigned_at)).where(splits.c.run_id == run_id)
        ).scalar_one()
        rows = conn.execute(
            sa.select(
                checkpoints.c.checkpoint_id,
                checkpoints.c.status,
                checkpoints.c.triggered_at,
                checkpoints.c.completed_at,
            ).where(checkpoints.c.run_id == run_id)
        ).all()
        acks = conn.execute(
            sa.select(
                checkpoint_acks.c.checkpoint_id,
                sa.func.min(checkpoint_acks.c.acked_at),
                sa.func.max(checkpoint_acks.c.acked_at),
            )
            .where(checkpoint_acks.c.run_id == run_id)
            .group_by(checkpoint_acks.c.checkpoint_id)
        ).all()
    done = [r for r in rows if r.status == "COMPLETED"]
    spread = {cid: (last - first).total_seconds() * 1e3 for cid, first, last in acks}
    last_ack = {cid: last for cid, _first, last in acks}
    ended = max(r.completed_at for r in done)
    return Measured(
        rows_in=summary.rows_in,
        seconds=(ended - started).total_seconds(),
        wall=wall,
        cpu=cpu,
        completed=len(done),
        aborted=sum(1 for r in rows if r.status == "ABORTED"),
        durations_ms=[(r.completed_at - r.triggered_at).total_seconds() * 1e3 for r in done],
        acks_ms=[(last_ack[r.checkpoint_id] - r.triggered_at).total_seconds() * 1e3 for r in done],
        alignments_ms=[spread.get(r.checkpoint_id, 0.0) for r in done],
        summary=summary,
    )


def cleanup(engine: sa.Engine, source: str, output: Path) -> None:
    forget_source(engine, source)
    shutil.rmtree(output, ignore_errors=True)


def paired(values: list[float], baseline: list[float]) -> float:
    """Median over the rounds of value / baseline of the same round."""
    return statistics.median(v / b for v, b in zip(values, baseline, strict=True))


def report(args: argparse.Namespace, results: dict[Variant, Runs], events: int) -> Table:
    base = max(results[VARIANTS[0]].rates)
    base_cpu = results[VARIANTS[0]].cpu
    table = Table(
        title=(
            f"Checkpoints: {events:,} events, {args.days * args.files_per_day} files, "
            f"parallelism {args.parallelism}, best of {args.repeat} interleaved rounds "
            "(checkpoint columns: all rounds pooled)"
        )
    )
    table.add_column("variant", no_wrap=True)
    for column in (
        "events/s",
        "vs off",
        "rounds, k events/s",
        "CPU s/run (vs off)",
        "checkpoints ok / aborted",
        "duration p50 / p99 ms",
        "trigger→last ack p50 / p99 ms",
        "alignment p50 / p99 ms",
    ):
        table.add_column(column, justify="right")
    table.add_column("target", justify="right", no_wrap=True)
    for variant in VARIANTS:
        runs = results[variant]
        rate = max(runs.rates)
        ratio = rate / base
        if variant.target is None:
            verdict = "baseline" if variant is VARIANTS[0] else ""
        elif ratio >= variant.target:
            verdict = f"[green]ok (>= {variant.target:g}x)[/green]"
        else:
            verdict = f"[bold red]MISS (< {variant.target:g}x)[/bold red]"
        table.add_row(
            variant.label,
            f"{rate:,.0f}",
            f"{ratio:.2f}x",
            " ".join(f"{r / 1e3:.0f}" for r in runs.rates),
            f"{statistics.median(runs.cpu):.1f} ({paired(runs.cpu, base_cpu):.2f}x)",
            f"{runs.completed:,} / {runs.aborted:,}",
            f"{quantile(runs.durations_ms, 0.5):,.0f} / {quantile(runs.durations_ms, 0.99):,.0f}",
            f"{quantile(runs.acks_ms, 0.5):,.0f} / {quantile(runs.acks_ms, 0.99):,.0f}",
            f"{quantile(runs.alignments_ms, 0.5):,.0f} / {quantile(runs.alignments_ms, 0.99):,.0f}",
            verdict,
        )
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--events", type=int, default=400_000)
    parser.add_argument("--users", type=int, default=200_000)
    parser.add_argument("--days", type=int, default=4)
    parser.add_argument("--files-per-day", type=int, default=4)
    parser.add_argument("--parallelism", type=int, default=2, help="reader subtasks")
    parser.add_argument("--repeat", type=int, help="rounds, best of (default 5; --quick: 1)")
    parser.add_argument("--quick", action="store_true", help="small sizes, one round")
    args = parser.parse_args()
    if args.quick:
        args.events, args.users = 40_000, 20_000
    args.repeat = args.repeat or (1 if args.quick else 5)
    if min(args.events, args.users, args.days, args.files_per_day, args.repeat) < 1:
        parser.error("sizes and --repeat must be positive")

    started = time.perf_counter()
    settings = load_settings()
    platform = open_platform(settings)
    try:
        landing = prepare_data(settings, platform, args)
        base: dict[str, Any] = {
            "landing": landing,
            "warehouse_dir": landing.parent / "warehouse",
            "parallelism": args.parallelism,
        }
        with console.status("Warm-up (Spark session, Python workers; one day, not measured)…"):
            warm = [run_once(base, platform, v, dates=[START]) for v in VARIANTS[:2]]
        console.print(
            f"warm-up: {warm[0].rows_in:,} events twice in {sum(w.wall for w in warm):.1f} s, "
            f"{warm[1].cpu:.1f} CPU s the second time"
        )

        results = {variant: Runs() for variant in VARIANTS}
        rows_in = 0
        for round_ in range(args.repeat):
            order = VARIANTS if round_ % 2 == 0 else VARIANTS[::-1]
            for variant in order:
                with console.status(f"Round {round_ + 1}/{args.repeat}: {variant.label}…"):
                    m = run_once(base, platform, variant)
                rows_in = rows_in or m.rows_in
                assert m.rows_in == rows_in == args.events, (m.rows_in, rows_in, args.events)
                runs = results[variant]
                runs.rates.append(m.rows_in / m.seconds)
                runs.wall.append(m.wall)
                runs.cpu.append(m.cpu)
                runs.completed += m.completed
                runs.aborted += m.aborted
                runs.durations_ms += m.durations_ms
                runs.acks_ms += m.acks_ms
                runs.alignments_ms += m.alignments_ms
                console.print(
                    f"round {round_ + 1} {variant.label}: {m.rows_in / m.seconds:,.0f} events/s "
                    f"({m.seconds:.2f} s processing, {m.wall:.2f} s run, {m.cpu:.1f} CPU s), "
                    f"{m.completed} checkpoints (p50 {quantile(m.durations_ms, 0.5):,.0f} ms)"
                )
        console.print(report(args, results, rows_in))
        off = results[VARIANTS[0]].rates
        for variant in VARIANTS[1:]:
            rates = results[variant].rates
            console.print(
                f"{variant.label} vs off, events/s within each round: "
                f"{', '.join(f'{r / o:.2f}x' for r, o in zip(rates, off, strict=True))} "
                f"(median {paired(rates, off):.2f}x)"
            )
    finally:
        platform.close()
    console.print(f"total {time.perf_counter() - started:,.0f} s")


if __name__ == "__main__":
    main()
