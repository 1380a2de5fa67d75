"""``sluice run`` and ``sluice demo``: a pipeline's PySpark job run, alone or after its sample
data and discovery.

Threading: the CLI runs on one thread; nothing here is shared across threads.
"""

from __future__ import annotations

import sys
from datetime import date

import click
from rich.progress import TaskID

from enumerator_service import Settings
from spark_jobs._outcomes import ExitCode
from spark_jobs.cli._common import (
    console,
    date_option,
    dates_of,
    open_for,
    pipeline_named,
    progress_bar,
    settings_of,
)
from spark_jobs.cli._inputs import discover_all, write_demo_data
from spark_jobs.cli._render import left_lines, nothing_line, run_table
from spark_jobs.pipeline import Pipeline

__all__ = ["demo", "run_cmd"]


def _run(
    settings: Settings, pipeline: Pipeline, dates: list[date] | None, *, rebuild: bool = False
) -> None:
    """Run the pipeline; exit with the run's code (``spark_jobs._outcomes``) when it is not
    0: quarantined input (3), input held elsewhere (4)."""
    from spark_jobs.jobs import run_pipeline  # imports pyspark: only when running

    with progress_bar() as progress:
        # Shown from the run's first report: a run refused at its start (a definition or
        # configuration error) prints its one line without an empty bar above it.
        tasks: list[TaskID] = []

        def report(done: int, total: int) -> None:
            if not tasks:
                tasks.append(progress.add_task("splits", total=None))
            progress.update(tasks[0], completed=done, total=total)

        summary = run_pipeline(settings, pipeline, dates=dates, progress=report, rebuild=rebuild)
        if summary.nothing_new and tasks:
            progress.update(tasks[0], visible=False)
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


@click.command("run")
@click.argument("pipeline", required=False)
@date_option("Process only these days (a backfill; with --replace, a rebuild).")
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
    settings = settings_of(ctx)
    chosen = pipeline_named(settings, pipeline)
    days = dates_of(dates)  # (checked before anything is opened)
    open_for(settings, migrate=True).close()
    _run(settings, chosen, days, rebuild=replace)


@click.command("demo")
@click.argument("pipeline", required=False)
@click.pass_context
def demo(ctx: click.Context, pipeline: str | None) -> None:
    """Set up and run a pipeline on its sample data, in one go.

    The same as 'sluice db upgrade', 'sluice demo-data', 'sluice discover' and 'sluice run'
    one after the other, on the embedded defaults.
    """
    settings = settings_of(ctx)
    chosen = pipeline_named(settings, pipeline)
    platform = open_for(settings, migrate=True)
    try:
        write_demo_data(settings, platform, chosen)
        discover_all(platform, chosen, None)
    finally:
        platform.close()
    _run(settings, chosen, None)
