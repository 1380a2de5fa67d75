"""The ``sluice`` command line."""

from __future__ import annotations

import logging
import sys
import warnings
from collections.abc import Callable, Sequence
from datetime import date
from typing import Any, TypeVar

import click
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from enumerator_service._config import ConfigError, Settings, load_settings, redact_url
from enumerator_service._database import asyncpg_dsn
from enumerator_service._demo_data import DemoSpec, generate_events, load_users
from enumerator_service._operations import Platform, discover, open_platform, platform_status

__all__ = ["main"]

console = Console(highlight=False)
F = TypeVar("F", bound=Callable[..., Any])


def _settings(ctx: click.Context) -> Settings:
    settings = ctx.obj
    assert isinstance(settings, Settings)
    return settings


def _progress() -> Progress:
    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=False,
    )


def _open(settings: Settings) -> Platform:
    with console.status("Connecting to Postgres and applying migrations…"):
        return open_platform(settings)


@click.group()
@click.pass_context
def cli(ctx: click.Context) -> None:
    """Sluice: exactly-once enrichment of event streams (FLIP-27 sources, async I/O, Postgres)."""
    settings = load_settings()
    logging.basicConfig(level=settings.log_level, format="%(levelname)s %(name)s: %(message)s")
    ctx.obj = settings


@cli.group()
def db() -> None:
    """Platform database commands."""


@db.command("upgrade")
@click.pass_context
def db_upgrade(ctx: click.Context) -> None:
    """Apply the schema migrations (sql/versions) to the platform database."""
    platform = _open(_settings(ctx))
    console.print(f"Schema [bold]sluice[/] is up to date at {redact_url(platform.url)}")
    platform.close()


def _demo_data(settings: Settings, platform: Platform) -> None:
    spec = DemoSpec.from_settings(settings)
    with _progress() as progress:
        task = progress.add_task("events", total=spec.events)
        events = generate_events(settings.landing_path, spec, lambda n: progress.advance(task, n))
        if events.skipped:
            progress.update(task, completed=spec.events, description="events (already there)")
        users_task = progress.add_task(
            f"users → {settings.lookup_schema}.{settings.lookup_table}", total=spec.users
        )
        loaded = load_users(
            asyncpg_dsn(platform.url),
            schema=settings.lookup_schema,
            table=settings.lookup_table,
            key=settings.lookup_key,
            users=spec.users,
            seed=spec.seed,
            progress=lambda n: progress.advance(users_task, n),
        )
        if not loaded:
            progress.update(users_task, completed=spec.users, description="users (already there)")
    console.print(
        f"Landing: {events.files} files, {events.events:,} events "
        f"({events.malformed} malformed) in {settings.landing_path}"
    )


@cli.command("demo-data")
@click.pass_context
def demo_data(ctx: click.Context) -> None:
    """Generate the sample events (JSON Lines) and the users dimension table."""
    settings = _settings(ctx)
    platform = _open(settings)
    try:
        _demo_data(settings, platform)
    finally:
        platform.close()


def _dates(values: Sequence[str]) -> list[date] | None:
    if not values:
        return None
    try:
        return [date.fromisoformat(v) for v in values]
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--date") from None


_date_option = click.option(
    "--date",
    "dates",
    multiple=True,
    metavar="YYYY-MM-DD",
    help="Restrict to these dates (backfill).",
)


def _discover(platform: Platform, dates: list[date] | None) -> None:
    """Discover until no backlog is left: one capped tick after another.

    The per-tick cap keeps a Dagster sensor tick short; a command has no such limit, and each
    tick commits its chunk and cursor, so an interrupted command loses nothing.
    """
    registered = ticks = 0
    with console.status("Discovering landing files…") as status:
        while True:
            result = discover(platform, dates=dates)
            registered += result.splits_registered
            ticks += 1
            if result.complete:
                break
            status.update(f"Discovering landing files… {result.backlog_files:,} files to go")
    chunks = f" in {ticks} ticks" if ticks > 1 else ""
    console.print(
        f"Discovery: {result.files_seen} files seen, {registered} new splits registered{chunks}"
    )


@cli.command("discover")
@_date_option
@click.pass_context
def discover_cmd(ctx: click.Context, dates: tuple[str, ...]) -> None:
    """Run the split enumerator once: register new landing files as splits."""
    platform = _open(_settings(ctx))
    try:
        _discover(platform, _dates(dates))
    finally:
        platform.close()


def _run(settings: Settings, dates: list[date] | None, *, rebuild: bool = False) -> None:
    from spark_jobs.jobs import run_enrichment  # imports pyspark: only when running

    with _progress() as progress:
        task = progress.add_task("splits", total=None)

        def report(done: int, total: int) -> None:
            progress.update(task, completed=done, total=total)

        summary = run_enrichment(settings, dates=dates, progress=report, rebuild=rebuild)
        if summary.nothing_new:
            progress.update(task, visible=False)
    if summary.nothing_new:
        console.print(
            "[bold]Nothing new to process[/]: every discovered split is already committed."
        )
        return
    table = Table(title=f"Run {summary.run_id}", show_header=False)
    for name, value in (
        ("splits", f"{summary.splits:,}"),
        ("rows in", f"{summary.rows_in:,}"),
        ("rows out", f"{summary.rows_out:,}"),
        ("dead letters", f"{summary.dead_letters:,}"),
        (
            "checkpoints (aborted)",
            f"{summary.checkpoints:,} ({summary.checkpoints_aborted:,}, "
            f"{summary.fenced:,} of them fenced)",
        ),
        (
            "checkpoint p50 / p99",
            f"{summary.checkpoint_p50_ms:.0f} / {summary.checkpoint_p99_ms:.0f} ms "
            f"(alignment p50 {summary.alignment_p50_ms:.0f} ms)",
        ),
        ("lookups (queries)", f"{summary.lookups:,} ({summary.lookup_queries:,})"),
        ("lookup cache hits", f"{summary.cache_hit_rate:.1%}"),
        ("lookup p50 / p99", f"{summary.lookup_p50_ms:.1f} / {summary.lookup_p99_ms:.1f} ms"),
        ("seconds", f"{summary.seconds:,.1f}"),
        ("rows/s", f"{summary.rows_per_second:,.0f}"),
        ("output", str(settings.output_path)),
        ("replaced partitions", ", ".join(summary.rebuilt) or "none"),
    ):
        table.add_row(name, value)
    console.print(table)


@cli.command("run")
@_date_option
@click.option(
    "--replace",
    is_flag=True,
    help="Re-read the --date partitions processed before and replace their output whole.",
)
@click.pass_context
def run_cmd(ctx: click.Context, dates: tuple[str, ...], replace: bool) -> None:
    """Run the PySpark reader job over every unassigned split (of --date, if given)."""
    if replace and not dates:
        raise click.UsageError("--replace needs the partitions to replace (--date)")
    settings = _settings(ctx)
    _open(settings).close()
    _run(settings, _dates(dates), rebuild=replace)


@cli.command("status")
@click.pass_context
def status_cmd(ctx: click.Context) -> None:
    """Splits by state, last checkpoint, committed rows and dead letters."""
    settings = _settings(ctx)
    platform = _open(settings)
    try:
        status = platform_status(platform)
    finally:
        platform.close()
    table = Table(title=f"Source {settings.source_name}", show_header=False)
    for state in ("UNASSIGNED", "ASSIGNED", "READING", "COMPLETED"):
        table.add_row(f"splits {state.lower()}", f"{status.splits.get(state, 0):,}")
    table.add_row("rows committed", f"{status.rows_committed:,}")
    table.add_row("dead letters", f"{status.dead_letters:,}")
    for reason, count in status.dead_letter_reasons:
        table.add_row(f"  {reason}", f"{count:,}")
    last = status.last_checkpoint
    table.add_row(
        "last checkpoint",
        f"{last['checkpoint_id']} of {last['run_id']} {last['status']} at "
        f"{last['completed_at'] or last['triggered_at']:%Y-%m-%d %H:%M:%S}"
        if last
        else "none",
    )
    console.print(table)


@cli.command("demo")
@click.pass_context
def demo(ctx: click.Context) -> None:
    """Everything on embedded defaults: migrate, sample data, discover, run."""
    settings = _settings(ctx)
    platform = _open(settings)
    try:
        _demo_data(settings, platform)
        _discover(platform, None)
    finally:
        platform.close()
    _run(settings, None)


def main(argv: Sequence[str] | None = None) -> None:
    """Console entry point: configuration errors are one line on stderr and exit code 2."""
    warnings.filterwarnings("ignore", message=".*XDG_RUNTIME_DIR.*")
    try:
        cli.main(args=list(argv) if argv is not None else None, standalone_mode=False)
    except ConfigError as exc:
        click.echo(f"sluice: configuration error: {exc}", err=True)
        sys.exit(2)
    except click.exceptions.Abort:
        click.echo("Aborted.", err=True)
        sys.exit(130)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
