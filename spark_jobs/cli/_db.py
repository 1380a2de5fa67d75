"""``sluice db status`` and ``sluice db stop``: the platform database's lifecycle.

Neither command creates or starts anything: ``status`` only reports (and reads the schema
revision of a server that is already up), ``stop`` stops the home's embedded PostgreSQL.
"""

from __future__ import annotations

import click

from enumerator_service import (
    SchemaError,
    Settings,
    connect_engine,
    database_url,
    embedded_state,
    redact_url,
    require_current_schema,
    stop_embedded,
)

__all__ = ["db_status", "db_stop"]


def _settings(ctx: click.Context) -> Settings:
    settings = ctx.find_root().obj
    assert isinstance(settings, Settings)
    return settings


def _schema_line(url: str) -> str:
    engine = connect_engine(url, pool_size=1)
    try:
        require_current_schema(engine)
    except SchemaError as exc:
        return f"schema: {exc}"
    finally:
        engine.dispose()
    return "schema: up to date"


@click.command("status")
@click.pass_context
def db_status(ctx: click.Context) -> None:
    """Where the platform database is, whether it runs, and whether its schema is current
    (starts nothing)."""
    settings = _settings(ctx)
    if settings.database_url is not None:
        url = settings.database_url.get_secret_value()
        click.echo(f"database: {redact_url(url)} (SLUICE_DATABASE_URL; not managed by Sluice)")
        click.echo(_schema_line(url))
        return
    state = embedded_state(settings)
    if not state.exists:
        click.echo(
            f"no Sluice database at {settings.home_path} ('sluice db upgrade' or 'sluice demo' "
            f"creates an embedded PostgreSQL in {state.pgdata})"
        )
        return
    if state.pid is None:
        click.echo(f"embedded PostgreSQL in {state.pgdata}: stopped")
        return
    click.echo(f"embedded PostgreSQL in {state.pgdata}: running (pid {state.pid})")
    click.echo(_schema_line(database_url(settings, create=False)))


@click.command("stop")
@click.pass_context
def db_stop(ctx: click.Context) -> None:
    """Stop the embedded PostgreSQL of this home (SLUICE_HOME); nothing running is not an
    error."""
    settings = _settings(ctx)
    if settings.database_url is not None:
        click.echo("SLUICE_DATABASE_URL is set: that server is not managed by Sluice, not stopped")
        return
    state = embedded_state(settings)
    pid = stop_embedded(settings)
    if pid is None:
        click.echo(f"no embedded PostgreSQL running in {state.pgdata}")
        return
    click.echo(f"stopped the embedded PostgreSQL in {state.pgdata} (pid {pid})")
