"""``sluice demo-data`` and ``sluice discover``: what a run reads — a pipeline's sample input
written, and its input registered as splits.

Threading: the CLI runs on one thread; nothing here is shared across threads.
"""

from __future__ import annotations

from datetime import date
from typing import Any

import click

from enumerator_service import ConfigError, Platform, Settings, asyncpg_dsn, discover
from spark_jobs._outcomes import BadInputFailure, bad_input_line, is_bad_input
from spark_jobs.cli._common import (
    console,
    date_option,
    dates_of,
    open_for,
    pipeline_named,
    progress_bar,
    settings_of,
)
from spark_jobs.connectors._registry import source_connector_named
from spark_jobs.pipeline import Pipeline, SampleTarget
from spark_jobs.pipeline._demo_marks import check_landing, record_landing
from spark_jobs.pipeline._paths import discovery_of

__all__ = ["demo_data", "discover_all", "discover_cmd", "write_demo_data"]


def write_demo_data(settings: Settings, platform: Platform, pipeline: Pipeline) -> None:
    if pipeline.sample_data is None:
        raise ConfigError(f"{pipeline.name}: sample_data", "the pipeline has no sample data")
    with progress_bar() as progress:
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


@click.command("demo-data")
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
    settings = settings_of(ctx)
    chosen = pipeline_named(settings, pipeline)
    platform = open_for(settings)
    try:
        write_demo_data(settings, platform, chosen)
    finally:
        platform.close()


def discover_all(platform: Platform, pipeline: Pipeline, dates: list[date] | None) -> None:
    """Discover until no backlog is left: one capped tick after another.

    The per-tick cap keeps a Dagster sensor tick short; a command has no such limit, and each
    tick commits its chunk and cursor, so an interrupted command loses nothing.
    """
    spec = discovery_of(pipeline, platform.settings)
    registered = ticks = skipped = changed = unnamed = 0
    notes: dict[str, None] = {}  # ordered, each once over the ticks
    with console.status(f"Discovering {pipeline.name}…") as status:
        while True:
            result = discover(platform, spec, dates=dates, wait_settle=True)
            registered += result.splits_registered
            changed += result.changed_files
            skipped = max(skipped, result.skipped_links)  # each tick lists the whole folder
            unnamed = max(unnamed, result.skipped_names)
            notes.update(dict.fromkeys(result.notes))
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
        f"Discovery ({pipeline.name}): {result.seen}, "
        f"{registered} new splits registered{chunks}{links}{names}"
    )
    for note in notes:
        console.print(f"  {note}", markup=False, highlight=False)
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


@click.command("discover")
@click.argument("pipeline", required=False)
@date_option("Register only these days' input (a backfill).")
@click.pass_context
def discover_cmd(ctx: click.Context, pipeline: str | None, dates: tuple[str, ...]) -> None:
    """Register new landing files (or key ranges of a table) as splits.

    Runs the pipeline's split enumerator in ticks of at most
    SLUICE_DISCOVERY_MAX_FILES_PER_TICK files until no backlog is left (each tick commits
    its files and cursor). With --date, only those days' dt= folders are listed. A file still
    being written (changed within SLUICE_FILE_SETTLE_SECONDS) is waited for, up to three
    times that long, then left for a later discovery.
    """
    settings = settings_of(ctx)
    chosen = pipeline_named(settings, pipeline)
    days = dates_of(dates)
    if days and not chosen.plan.source.partitioned:  # as `run --date` refuses it
        raise ConfigError(f"{chosen.name}: dates", "the pipeline's output is unpartitioned")
    platform = open_for(settings)
    try:
        discover_all(platform, chosen, days)
    except Exception as exc:
        if not is_bad_input(exc):
            raise
        # A source's input (a dropped slot): the one line a run prints for it, too.
        raise BadInputFailure(f"pipeline {chosen.name}: {bad_input_line(exc)}") from exc
    finally:
        platform.close()
