"""``sluice pipelines``, ``sluice status`` and ``sluice dead-letters``: what is registered,
where each pipeline is, and the records it could not turn into output.

Both only read: they never create a database nor change its schema.

Threading: the CLI runs on one thread; nothing here is shared across threads.
"""

from __future__ import annotations

import json
import sys

import click
from sqlalchemy.engine import Engine

from enumerator_service import (
    ConfigError,
    ServerUnreachable,
    Settings,
    list_dead_letters,
    platform_status,
)
from spark_jobs._outcomes import ExitCode
from spark_jobs.cli._common import (
    console,
    date_option,
    dates_of,
    open_for,
    pipeline_named,
    settings_of,
)
from spark_jobs.cli._render import describe_table, status_json, status_table
from spark_jobs.cli._render_dead_letters import (
    dead_letters_json,
    dead_letters_view,
)
from spark_jobs.connectors._registry import sink_connector_named, source_connector_named
from spark_jobs.pipeline import Pipeline
from spark_jobs.pipeline._errors import MissingTableError
from spark_jobs.pipeline._plan import Plan
from spark_jobs.pipeline._registry import load_pipelines, pick_pipeline

__all__ = ["dead_letters_cmd", "pipelines_cmd", "status_cmd"]

#: Dead letters ``sluice dead-letters`` shows in full by default (not with ``--json``).
_SHOWN = 20


@click.command("pipelines")
@click.pass_context
def pipelines_cmd(ctx: click.Context) -> None:
    """List the registered pipelines with their source, steps, sink and output fields.

    The output fields are shown with their types, those of looked-up columns from the
    database's catalog. A definition that does not fit the database (a key type, a missing
    column, an existing sink table without a unique index on the upsert key) is an error:
    exit code 2 after the listing; a table not created yet is only a note; a database that
    does not answer (a url_env server down) is exit code 1.
    """
    settings = settings_of(ctx)
    found = load_pipelines(settings)
    if not found:
        pick_pipeline(found, None)  # raises: nothing registered
    platform = open_for(settings)
    errors = unreachable = 0
    try:
        for pipeline in found.values():
            plan, note, error, outage = _checked(pipeline, platform.engine, settings)
            errors += error
            unreachable += outage
            connector = source_connector_named(pipeline.plan.source.kind)
            landing = connector.location(pipeline, settings)
            console.print(describe_table(pipeline, plan, landing, note, error=error))
    finally:
        platform.close()
    if errors:
        click.echo(f"sluice: {errors} pipeline definition error(s), shown above", err=True)
        sys.exit(ExitCode.USAGE)
    if unreachable:  # (running it again once the server is back may pass: exit 1)
        click.echo(
            f"sluice: unreachable: {unreachable} pipeline(s) read a database that did not"
            " answer, shown above",
            err=True,
        )
        sys.exit(ExitCode.FAILED)


def _checked(
    pipeline: Pipeline, engine: Engine, settings: Settings
) -> tuple[Plan | None, str | None, bool, bool]:
    """(the plan with the catalog's types or None, a note, is the note an error, is it an
    outage) of checking ``pipeline`` against the database: its definition, then an existing
    sink table (read-only)."""
    from spark_jobs.pipeline._catalog import resolve

    try:
        plan = resolve(pipeline, engine).plan
    except MissingTableError as exc:  # created later (sample data, the user)
        return None, str(exc), False, False
    except ServerUnreachable as exc:  # an outage (a url_env server), not a mistake
        return None, f"unreachable: {exc}", False, True
    except (ConfigError, ValueError) as exc:  # the definition does not fit
        return None, str(exc), True, False
    try:
        sink_connector_named(pipeline.plan.sink.kind).check_existing(engine, pipeline, settings)
    except ConfigError as exc:  # (e.g. an existing table without a unique index on the key)
        return plan, str(exc), True, False
    return plan, None, False, False


@click.command("status")
@click.argument("pipeline", required=False)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_context
def status_cmd(ctx: click.Context, pipeline: str | None, as_json: bool) -> None:
    """Show where a pipeline is (or every registered one).

    Splits by state, committed rows, rows removed by steps, dead letters by reason,
    quarantined splits (file, reason, attempts, last error), the last checkpoint, live state
    (watermark and lag, backlog and oldest waiting split, rows/s over the latest run's last
    minute, last checkpoint's duration), complete partitions, and what the source holds on a
    server (a CDC source's replication slot: active or not, the WAL it retains).
    """
    settings = settings_of(ctx)
    found = load_pipelines(settings)  # (an import error fails before any database is opened)
    platform = open_for(settings)
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


@click.command("dead-letters")
@click.argument("pipeline", required=False)
@date_option("Only the dead letters counted on these days.")
@click.option("--reason", help="Only dead letters whose reason contains this text (any case).")
@click.option(
    "--limit",
    type=click.IntRange(1, None),
    help=f"How many dead letters to show in full [default: {_SHOWN}; with --json: all].",
)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output, raw bytes exact.")
@click.pass_context
def dead_letters_cmd(
    ctx: click.Context,
    pipeline: str | None,
    dates: tuple[str, ...],
    reason: str | None,
    limit: int | None,
    as_json: bool,
) -> None:
    """Show a pipeline's dead letters: how many per day and reason, then the first of them.

    Each one shows its day (the partition it counts on), where it came from (file and byte
    offset, Kafka topic-partition and offset, table and key), its reason and its raw input,
    escaped: bytes that are not UTF-8 and control characters as \\xNN (\\n, \\t, \\r),
    a backslash as \\\\. --date picks days (repeat it), --reason filters by a piece of the
    reason. --json gives every field, the raw bytes exactly (base64), and every dead letter
    unless --limit.
    """
    settings = settings_of(ctx)
    days = dates_of(dates)
    chosen = pipeline_named(settings, pipeline)
    shown = limit if limit is not None or as_json else _SHOWN
    platform = open_for(settings)
    try:
        listing = list_dead_letters(
            platform.engine, chosen.name, days=days, reason=reason, limit=shown
        )
    finally:
        platform.close()
    filtered = bool(days or reason)
    if as_json:
        click.echo(json.dumps(dead_letters_json(listing), indent=2, sort_keys=True))
    else:
        console.print(dead_letters_view(listing, shown or 0, filtered))
