"""``sluice db upgrade|status|stop|url|shell``: the platform database's lifecycle and a way in.

``upgrade`` creates the database (an embedded PostgreSQL when no SLUICE_DATABASE_URL) or migrates
its schema; the other commands never change a schema.

``status`` and ``stop`` create and start nothing: ``status`` only reports (and reads the schema
revision of a server that is already up), ``stop`` stops the home's embedded PostgreSQL.
``url`` and ``shell`` start the home's embedded server when it is stopped (never create one),
so that a user can open their own tables next to the platform's.
"""

from __future__ import annotations

import os

import click

from enumerator_service import (
    ConfigError,
    SchemaError,
    Settings,
    connect_engine,
    database_url,
    embedded_state,
    psql_path,
    redact_url,
    require_current_schema,
    schema_revision,
    split_password,
    stop_embedded,
)
from spark_jobs.cli._common import console, open_for

__all__ = ["db", "db_shell", "db_status", "db_stop", "db_upgrade", "db_url"]


def _settings(ctx: click.Context) -> Settings:
    settings = ctx.find_root().obj
    assert isinstance(settings, Settings)
    return settings


def _schema_line(url: str) -> str:
    engine = connect_engine(url, pool_size=1)
    try:
        require_current_schema(engine)
        revision = schema_revision(engine)
    except SchemaError as exc:
        return f"schema: {exc}"
    finally:
        engine.dispose()
    return f"schema: up to date (revision {revision})"


@click.command("status")
@click.pass_context
def db_status(ctx: click.Context) -> None:
    """Show the platform database's location, state and schema version.

    Where it is, whether it runs (the embedded server's pid), whether its schema is current.
    Starts nothing: an embedded PostgreSQL that is stopped is reported as stopped.
    """
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
    """Stop the embedded PostgreSQL of SLUICE_HOME.

    A fast shutdown. Nothing running, or an external SLUICE_DATABASE_URL (not managed by
    Sluice), is said and exits 0.
    """
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


def _libpq_url(settings: Settings) -> str:
    """The platform database's URL in libpq form, its password included: a SQLAlchemy driver
    suffix (``postgresql+psycopg``) is dropped, since psql and psycopg read plain
    ``postgresql://`` URLs."""
    scheme, sep, rest = database_url(settings, create=False).partition("://")
    return f"{scheme.split('+')[0]}{sep}{rest}"


@click.command("url")
@click.option(
    "--show-password", is_flag=True, help="Print the password instead of *** (mind your logs)."
)
@click.pass_context
def db_url(ctx: click.Context, show_password: bool) -> None:
    """Print the platform database's URL.

    For psql, psycopg or SQLAlchemy, e.g. psql "$(sluice db url)". Starts the home's
    embedded PostgreSQL if it is stopped (creates none: run 'sluice db upgrade' first). A
    password is printed as *** unless --show-password.
    """
    url = _libpq_url(_settings(ctx))
    click.echo(url if show_password else redact_url(url))


@click.command(
    "shell",
    context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False},
)
@click.argument("psql_args", nargs=-1, type=click.UNPROCESSED)
@click.pass_context
def db_shell(ctx: click.Context, psql_args: tuple[str, ...]) -> None:
    """Open psql on the platform database.

    Runs the psql bundled with the embedded server, with PSQL_ARGS passed on: sluice db
    shell -c 'select 1', sluice db shell -f tables.sql. Starts the home's embedded
    PostgreSQL if it is stopped. The password goes to psql through the environment
    (PGPASSWORD), never on its command line.
    """
    bare, password = split_password(_libpq_url(_settings(ctx)))
    env = dict(os.environ)
    if password is not None:
        env["PGPASSWORD"] = password
    psql = psql_path()
    # psql replaces this process: its exit code, signals (Ctrl-C) and terminal are the user's.
    os.execve(psql, [psql, "--dbname", bare, *psql_args], env)  # noqa: S606 (no shell: argv as given)


@click.command("upgrade")
@click.pass_context
def db_upgrade(ctx: click.Context) -> None:
    """Create or migrate the platform database's schema.

    Applies the Alembic migrations (sql/versions) to the platform database, creating the
    embedded PostgreSQL first when SLUICE_HOME has none. Concurrent upgrades are serialised.
    Other commands only check the schema version and ask for this command when it is behind.
    """
    settings = _settings(ctx)
    before = _revision_before(settings)
    platform = open_for(settings, migrate=True)
    revision = schema_revision(platform.engine)
    where = redact_url(platform.url)
    # soft_wrap: a long URL stays on its line (a narrow terminal wrapped it onto the next).
    if before == "?":
        line = f"Schema [bold]sluice[/] is at revision {revision} at {where}"
    elif before == revision:
        line = f"Schema [bold]sluice[/] was already up to date (revision {revision}) at {where}"
    else:
        done = "created" if before is None else f"migrated from revision {before}"
        line = f"Schema [bold]sluice[/] {done} to revision {revision} at {where}"
    console.print(line, soft_wrap=True)
    platform.close()


def _revision_before(settings: Settings) -> str | None:
    """The schema's revision before the upgrade (None: no database or schema yet; ``"?"``:
    not known — the upgrade that follows says what is wrong with the database)."""
    try:
        url = database_url(settings, create=False)
    except ConfigError:  # no embedded database yet: the upgrade creates it
        return None
    try:
        engine = connect_engine(url, pool_size=1)
        try:
            return schema_revision(engine)
        finally:
            engine.dispose()
    except Exception:  # (unreachable, refused: the upgrade's own one line follows)
        return "?"


@click.group()
def db() -> None:
    """The platform database: create or migrate it, see it, stop it, open it.

    Without SLUICE_DATABASE_URL the platform database is an embedded PostgreSQL under
    SLUICE_HOME/pg, created by 'sluice db upgrade' (or 'sluice demo').
    """


db.add_command(db_upgrade)
db.add_command(db_status)
db.add_command(db_stop)
db.add_command(db_url)
db.add_command(db_shell)
