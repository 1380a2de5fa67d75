"""The ``sluice`` commands. Each opens the platform, finds the registered pipelines
(``SLUICE_PIPELINES``) and works on one of them (or all, for ``status``)."""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Sequence
from datetime import date
from typing import Any

import click
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from enumerator_service import (
    ConfigError,
    Platform,
    Settings,
    StorageOptions,
    asyncpg_dsn,
    discover,
    load_settings,
    open_platform,
    partition_date,
    platform_status,
    redact_url,
    retry_splits,
    sweep_secret_files,
)
from spark_jobs._outcomes import ExitCode
from spark_jobs.cli._cdc import cdc
from spark_jobs.cli._db import db_shell, db_status, db_stop, db_url
from spark_jobs.cli._render import (
    describe_table,
    failed_line,
    left_lines,
    nothing_line,
    run_table,
    status_json,
    status_table,
)
from spark_jobs.connectors._registry import source_connector_named
from spark_jobs.pipeline import Pipeline, SampleTarget
from spark_jobs.pipeline._demo_marks import check_landing, record_landing
from spark_jobs.pipeline._errors import MissingTableError
from spark_jobs.pipeline._paths import discovery_of
from spark_jobs.pipeline._registry import load_pipelines, pick_pipeline

__all__ = ["cli"]

console = Console(highlight=False)


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


def _open(settings: Settings, *, migrate: bool = False) -> Platform:
    """The platform; ``migrate`` only for the commands that set it up (``db upgrade``,
    ``demo``, ``run``): the others never create a database nor change its schema, and fail
    with one line when it is missing or behind."""
    if not migrate:
        with console.status("Connecting to Postgres…"):
            return open_platform(settings, migrate=False)
    with console.status("Connecting to Postgres and applying migrations…"):
        return open_platform(settings, migrate=True)


def _pipeline(settings: Settings, name: str | None) -> Pipeline:
    return pick_pipeline(load_pipelines(settings), name)


@click.group()
@click.version_option(package_name="sluice", prog_name="sluice")
@click.pass_context
def cli(ctx: click.Context) -> None:
    """Sluice: exactly-once pipelines over FLIP-27 sources, async lookups and Postgres.

    Every command works on the pipelines registered with SLUICE_PIPELINES; PIPELINE may be
    left out when exactly one is registered. Settings come from SLUICE_* environment
    variables. Errors are one line on stderr with exit code 2 (usage, configuration,
    definition) or the run's own exit code.
    """
    settings = load_settings()
    logging.basicConfig(level=settings.log_level, format="%(levelname)s %(name)s: %(message)s")
    sweep_secret_files(settings.home_path)  # password files of drivers that were killed
    ctx.obj = settings


@cli.group()
def db() -> None:
    """The platform database: create or migrate it, see it, stop it, open it.

    Without SLUICE_DATABASE_URL the platform database is an embedded PostgreSQL under
    SLUICE_HOME/pg, created by 'sluice db upgrade' (or 'sluice demo').
    """


db.add_command(db_status)
db.add_command(db_stop)
db.add_command(db_url)
db.add_command(db_shell)


@db.command("upgrade")
@click.pass_context
def db_upgrade(ctx: click.Context) -> None:
    """Create or migrate the platform database's schema.

    Applies the Alembic migrations (sql/versions) to the platform database, creating the
    embedded PostgreSQL first when SLUICE_HOME has none. Concurrent upgrades are serialised.
    Other commands only check the schema version and ask for this command when it is behind.
    """
    platform = _open(_settings(ctx), migrate=True)
    console.print(f"Schema [bold]sluice[/] is up to date at {redact_url(platform.url)}")
    platform.close()


@cli.command("pipelines")
@click.pass_context
def pipelines_cmd(ctx: click.Context) -> None:
    """List the registered pipelines with their source, steps, sink and output fields.

    The output fields are shown with their types, those of looked-up columns from the
    database's catalog. A definition that does not fit the database (a key type, a missing
    column) is an error: exit code 2 after the listing; a table not created yet is only a
    note.
    """
    from spark_jobs.pipeline._catalog import resolve

    settings = _settings(ctx)
    found = load_pipelines(settings)
    if not found:
        pick_pipeline(found, None)  # raises: nothing registered
    platform = _open(settings)
    errors = 0
    try:
        for pipeline in found.values():
            error = False
            try:
                plan = resolve(pipeline, platform.engine).plan
                note = None
            except MissingTableError as exc:  # created later (sample data, the user)
                plan, note = None, str(exc)
            except (ConfigError, ValueError) as exc:  # the definition does not fit
                plan, note, error = None, str(exc), True
            errors += error
            connector = source_connector_named(pipeline.plan.source.kind)
            landing = connector.location(pipeline, settings)
            console.print(describe_table(pipeline, plan, landing, note, error=error))
    finally:
        platform.close()
    if errors:
        click.echo(f"sluice: {errors} pipeline definition error(s), shown above", err=True)
        sys.exit(ExitCode.USAGE)


def _demo_data(settings: Settings, platform: Platform, pipeline: Pipeline) -> None:
    if pipeline.sample_data is None:
        raise ConfigError(f"{pipeline.name}: sample_data", "the pipeline has no sample data")
    with _progress() as progress:
        tasks: dict[str, Any] = {}

        def report(what: str, done: int, total: int) -> None:
            if what not in tasks:
                tasks[what] = progress.add_task(what, total=total)
            progress.update(tasks[what], completed=done, total=total)

        connector = source_connector_named(pipeline.plan.source.kind)
        folder = connector.sample_folder(pipeline, settings)
        # Only into a folder that is empty or holds only sample data (one line otherwise);
        # the generator claims its tables itself (claim_demo_table) before writing any.
        landing = folder or settings.data_path / "samples" / pipeline.name
        check_landing(landing)
        target = SampleTarget(settings, landing, asyncpg_dsn(platform.url), report)
        try:
            said = pipeline.sample_data(target)
        finally:  # also after a failure half-way: what it wrote is sample data
            record_landing(landing)
    console.print(f"{pipeline.name}: {said}")


@cli.command("demo-data")
@click.argument("pipeline", required=False)
@click.pass_context
def demo_data(ctx: click.Context, pipeline: str | None) -> None:
    """Write the pipeline's sample data: landing files and lookup tables.

    Runs the pipeline's sample_data generator (skipped when its data is already there). It
    writes only into objects it created and marked: tables carrying its demo mark (created
    when missing, refilled when the sizes change) and a landing folder that is missing,
    empty or holds only its own files. Anything else (a real table, a folder with other
    files) is refused with one line and exit code 2, and nothing is changed. Never point it
    at a production database.
    """
    settings = _settings(ctx)
    chosen = _pipeline(settings, pipeline)
    platform = _open(settings)
    try:
        _demo_data(settings, platform, chosen)
    finally:
        platform.close()


def _dates(values: Sequence[str]) -> list[date] | None:
    """The ``--date`` values as days (each becomes a ``dt=`` folder): one ConfigError line
    naming ``--date`` for anything that is not ``YYYY-MM-DD``."""
    if not values:
        return None
    return [partition_date(v, "--date") for v in values]


_date_option = click.option(
    "--date",
    "dates",
    multiple=True,
    metavar="YYYY-MM-DD",
    help="Restrict to these dates (backfill).",
)


def _discover(platform: Platform, pipeline: Pipeline, dates: list[date] | None) -> None:
    """Discover until no backlog is left: one capped tick after another.

    The per-tick cap keeps a Dagster sensor tick short; a command has no such limit, and each
    tick commits its chunk and cursor, so an interrupted command loses nothing.
    """
    spec = discovery_of(pipeline, platform.settings)
    registered = ticks = skipped = changed = unnamed = 0
    with console.status(f"Discovering {pipeline.name}…") as status:
        while True:
            result = discover(platform, spec, dates=dates, wait_settle=True)
            registered += result.splits_registered
            changed += result.changed_files
            skipped = max(skipped, result.skipped_links)  # each tick lists the whole folder
            unnamed = max(unnamed, result.skipped_names)
            ticks += 1
            if result.complete:
                break
            status.update(f"Discovering {pipeline.name}… {result.backlog_files:,} files to go")
    chunks = f" in {ticks} ticks" if ticks > 1 else ""
    # Links out of the landing folder, broken links, loops (each logged once as a warning).
    links = f"; {skipped} symbolic link(s) skipped" if skipped else ""
    # Each also logged once as a warning naming it (escaped).
    names = f"; {unnamed} file(s) skipped: name not UTF-8" if unnamed else ""
    console.print(
        f"Discovery ({pipeline.name}): {result.files_seen} seen, "
        f"{registered} new splits registered{chunks}{links}{names}"
    )
    if result.unsettled_files:
        console.print(
            f"[yellow]{result.unsettled_files} file(s) still being written[/] (changed within "
            f"the last {platform.settings.file_settle_seconds:g} s, SLUICE_FILE_SETTLE_SECONDS): "
            "left for the next discovery"
        )
    if changed:
        policy = platform.settings.file_change_policy
        what = (
            "quarantined (`sluice status` names them; `sluice retry` reads them as they are)"
            if policy == "refuse"
            else "to be read whole again as a new version"
        )
        console.print(
            f"[yellow]{changed} processed file(s) changed since discovery[/] (replaced, "
            f"re-created or grown): {what} (SLUICE_FILE_CHANGE_POLICY={policy})"
        )


@cli.command("discover")
@click.argument("pipeline", required=False)
@_date_option
@click.pass_context
def discover_cmd(ctx: click.Context, pipeline: str | None, dates: tuple[str, ...]) -> None:
    """Register new landing files (or key ranges of a table) as splits.

    Runs the pipeline's split enumerator in ticks of at most
    SLUICE_DISCOVERY_MAX_FILES_PER_TICK files until no backlog is left (each tick commits
    its files and cursor). With --date, only those days' dt= folders are listed. A file still
    being written (changed within SLUICE_FILE_SETTLE_SECONDS) is waited for, up to three
    times that long, then left for a later discovery.
    """
    settings = _settings(ctx)
    chosen = _pipeline(settings, pipeline)
    days = _dates(dates)
    platform = _open(settings)
    try:
        _discover(platform, chosen, days)
    finally:
        platform.close()


def _run(
    settings: Settings, pipeline: Pipeline, dates: list[date] | None, *, rebuild: bool = False
) -> None:
    """Run the pipeline; exit with the run's code (``spark_jobs._outcomes``) when it is not
    0: quarantined input (3), input held elsewhere (4)."""
    from spark_jobs.jobs import run_pipeline  # imports pyspark: only when running

    with _progress() as progress:
        task = progress.add_task("splits", total=None)

        def report(done: int, total: int) -> None:
            progress.update(task, completed=done, total=total)

        summary = run_pipeline(settings, pipeline, dates=dates, progress=report, rebuild=rebuild)
        if summary.nothing_new:
            progress.update(task, visible=False)
    if summary.nothing_new and rebuild and not summary.rebuilt:
        # Asked to replace, and nothing was: never "nothing new" with exit 0.
        days = ", ".join(d.isoformat() for d in dates or [])
        click.echo(
            f"sluice: cannot replace: nothing of {days} was replaced ({pipeline.name} has no "
            "committed output of it to replace, nor input of it to read)",
            err=True,
        )
        sys.exit(ExitCode.USAGE)
    if summary.nothing_new:
        console.print(nothing_line(summary))
    else:
        console.print(run_table(summary, pipeline, settings))
    for line in left_lines(summary):
        console.print(line, markup=False)
    if summary.exit_code:
        sys.exit(summary.exit_code)


@cli.command("run")
@click.argument("pipeline", required=False)
@_date_option
@click.option(
    "--replace",
    is_flag=True,
    help="Re-read the --date partitions processed before and replace their output whole.",
)
@click.pass_context
def run_cmd(
    ctx: click.Context, pipeline: str | None, dates: tuple[str, ...], replace: bool
) -> None:
    """Read every unassigned split (of the --date days) into the pipeline's sink.

    Runs the pipeline's PySpark job. Each record is written exactly once: output and dead
    letters commit with checkpoints, and the next run resumes a failed one's splits from
    where their committed output ends.
    With --replace, the --date days are read again from scratch and their output replaced
    whole (a --replace that cannot start, or that found nothing to replace, is one line and
    exit code 2). Exit code: 0, or 3 (quarantined input), 4 (input left to another run), 5
    (an error in the pipeline's code), 1 (failed).
    """
    if replace and not dates:
        raise click.UsageError("--replace needs the partitions to replace (--date)")
    settings = _settings(ctx)
    chosen = _pipeline(settings, pipeline)
    days = _dates(dates)  # (checked before anything is opened)
    _open(settings, migrate=True).close()
    _run(settings, chosen, days, rebuild=replace)


@cli.command("status")
@click.argument("pipeline", required=False)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_context
def status_cmd(ctx: click.Context, pipeline: str | None, as_json: bool) -> None:
    """Show where a pipeline is (or every registered one).

    Splits by state, committed rows, rows removed by steps, dead letters by reason,
    quarantined splits (file, reason, attempts, last error), the last checkpoint, live state
    (watermark and lag, backlog and oldest waiting split, rows/s, last checkpoint's
    duration), complete partitions, and what the source holds on a server (a CDC source's
    replication slot: active or not, the WAL it retains).
    """
    settings = _settings(ctx)
    found = load_pipelines(settings)  # (an import error fails before any database is opened)
    platform = _open(settings)
    try:
        chosen = [pick_pipeline(found, pipeline)] if pipeline or not found else [*found.values()]
        statuses = [platform_status(platform, p.name) for p in chosen]
        with platform.engine.connect() as conn:
            held = {
                p.name: source_connector_named(p.plan.source.kind).source_status(conn, p.plan)
                for p in chosen
            }
    finally:
        platform.close()
    if as_json:
        click.echo(json.dumps(status_json(statuses, held), indent=2, sort_keys=True))
        return
    for status in statuses:
        console.print(status_table(status, held.get(status.source)))


class UnknownSplitError(click.ClickException):
    """``sluice retry`` of a split that is not quarantined: one line, exit code 2."""

    exit_code = 2


cli.add_command(cdc)


@cli.command("retry")
# A split id is a positive bigint: anything else is a usage error before any query.
@click.argument("split", required=False, type=click.IntRange(1, 2**63 - 1))
@click.option("--all-failed", is_flag=True, help="Every quarantined (FAILED) split.")
@click.option("--pipeline", help="With --all-failed: only this pipeline's splits.")
@click.pass_context
def retry_cmd(
    ctx: click.Context, split: int | None, all_failed: bool, pipeline: str | None
) -> None:
    """Put quarantined (FAILED) splits back in the pool.

    SPLIT is a split id from 'sluice status'; --all-failed takes every quarantined split
    (of --pipeline). Their failed attempts are reset; the next run (or the live continuous
    one) reads them from where their committed output ends. A SPLIT that is not quarantined
    is a one-line error, exit code 2.
    """
    if (split is None) == (not all_failed):
        raise click.UsageError("give either a SPLIT id or --all-failed")
    if pipeline is not None and not all_failed:
        raise click.UsageError("--pipeline goes with --all-failed")
    settings = _settings(ctx)
    source = _pipeline(settings, pipeline).name if pipeline is not None else None
    platform = _open(settings)
    try:
        ids = None if split is None else [split]
        retried = retry_splits(
            platform.engine,
            ids,
            source=source,
            target_split_bytes=settings.target_split_bytes,
            storage=StorageOptions.of(settings),  # files on an object store: their identity
        )
    finally:
        platform.close()
    if split is not None and not retried:
        raise UnknownSplitError(f"split {split} is not quarantined (no FAILED split has that id)")
    for done in retried:
        click.echo(f"split {done.id} ({done.source}) back in the pool: {failed_line(done)}")
    if not retried:
        click.echo("no quarantined splits")


@cli.command("demo")
@click.argument("pipeline", required=False)
@click.pass_context
def demo(ctx: click.Context, pipeline: str | None) -> None:
    """Set up and run a pipeline on its sample data, in one go.

    The same as 'sluice db upgrade', 'sluice demo-data', 'sluice discover' and 'sluice run'
    one after the other, on the embedded defaults.
    """
    settings = _settings(ctx)
    chosen = _pipeline(settings, pipeline)
    platform = _open(settings, migrate=True)
    try:
        _demo_data(settings, platform, chosen)
        _discover(platform, chosen, None)
    finally:
        platform.close()
    _run(settings, chosen, None)


@cli.command("dagster-home")
@click.pass_context
def dagster_home(ctx: click.Context) -> None:
    """Create the Dagster home of the local UI and print its path.

    The folder is SLUICE_HOME/dagster (used by 'make ui'); its dagster.yaml turns telemetry
    and the first-visit dialog off (an existing file is kept, with what it lacks added).
    """
    from spark_jobs.cli._dagster_home import prepare_dagster_home

    click.echo(str(prepare_dagster_home(_settings(ctx).home_path / "dagster")))
