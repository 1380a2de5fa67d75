"""``sluice retry``: quarantined (FAILED) splits put back in the pool.

Threading: the CLI runs on one thread; nothing here is shared across threads.
"""

from __future__ import annotations

import click

from enumerator_service import StorageOptions, retry_splits
from spark_jobs.cli._common import open_for, pipeline_named, settings_of
from spark_jobs.cli._render import failed_line

__all__ = ["UnknownSplitError", "retry_cmd"]


class UnknownSplitError(click.ClickException):
    """``sluice retry`` of a split that is not quarantined: one line, exit code 2."""

    exit_code = 2


@click.command("retry")
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
    settings = settings_of(ctx)
    source = pipeline_named(settings, pipeline).name if pipeline is not None else None
    platform = open_for(settings)
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
