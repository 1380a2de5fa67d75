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
import re
from collections.abc import Sequence
from itertools import islice
from urllib.parse import quote

import click
from sqlalchemy.engine import make_url

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


#: psql's short options that take a value (its getopt string is
#: ``aAbc:d:eEf:F:h:HlL:no:p:P:qR:sStT:U:v:VwWxXz?01``).
_PSQL_SHORT_WITH_VALUE = frozenset("cdfFhLopPRTUv")
#: psql's long options, True for those that take a value (``--help[=topic]`` takes one only
#: after ``=``). psql's getopt_long also takes an unambiguous prefix: ``--db`` is ``--dbname``.
_PSQL_LONG = {
    **dict.fromkeys(
        [
            "command",
            "dbname",
            "file",
            "field-separator",
            "host",
            "log-file",
            "output",
            "port",
            "pset",
            "record-separator",
            "table-attr",
            "username",
            "set",
            "variable",
        ],
        True,
    ),
    **dict.fromkeys(
        [
            "echo-all",
            "no-align",
            "echo-queries",
            "echo-errors",
            "echo-hidden",
            "field-separator-zero",
            "html",
            "list",
            "no-readline",
            "single-transaction",
            "quiet",
            "record-separator-zero",
            "single-step",
            "single-line",
            "tuples-only",
            "version",
            "no-password",
            "password",
            "expanded",
            "no-psqlrc",
            "help",
            "csv",
        ],
        False,
    ),
}


def _long_option(name: str) -> str | None:
    """The psql long option ``--name`` stands for (exact, else a prefix of one only), None
    when psql would not know it (and refuse it)."""
    if name in _PSQL_LONG:
        return name
    found = [option for option in _PSQL_LONG if option.startswith(name)]
    return found[0] if len(found) == 1 else None


def _split_dbname(psql_args: Sequence[str]) -> tuple[str | None, list[str]]:
    """(the database of the last ``-d``/``--dbname`` in ``psql_args`` or None, the arguments
    without those), read as psql reads its options: ``-d x``, ``-dx``, ``-Atd x``, ``--dbname
    x``, ``--dbname=x``, ``--db x``; an option's value (``-c '-d'``) is no option, and all after
    ``--`` is left as is. UsageError for a ``-d`` without a name or with an empty one."""
    name: str | None = None
    rest: list[str] = []
    args = iter(psql_args)
    for arg in args:
        if arg == "--":
            rest += [arg, *args]
            break
        if arg.startswith("--"):
            key, eq, value = arg[2:].partition("=")
            option = _long_option(key)
            if option != "dbname":
                rest.append(arg)
                if option is not None and _PSQL_LONG[option] and not eq:
                    rest += islice(args, 1)  # its value
                continue
            name = value if eq else next(args, "")
        elif arg.startswith("-") and len(arg) > 1:
            # A cluster of short options (-At): the first that takes a value takes the rest of
            # the argument, or the next argument when nothing is left.
            at = next((at for at in range(1, len(arg)) if arg[at] in _PSQL_SHORT_WITH_VALUE), 0)
            if arg[at] != "d":
                rest.append(arg)
                if at == len(arg) - 1:
                    rest += islice(args, 1)  # its value
                continue
            if at > 1:
                rest.append(arg[:at])  # the -At of -Atd
            name = arg[at + 1 :] or next(args, "")
        else:
            rest.append(arg)  # an operand (psql's [DBNAME [USERNAME]]): psql's to read
            continue
        if not name:
            raise click.UsageError("-d/--dbname needs a database name (missing or empty)")
    return name, rest


def _with_database(url: str, name: str) -> str:
    """``url`` (libpq form, parsed by SQLAlchemy) on the database ``name``: its host, socket,
    port, user and parameters kept; the name percent-encoded whole (libpq decodes it)."""
    stand_in = "SLUICE0DBNAME0STANDIN"  # renders as is; swapped for the encoded name
    rendered = make_url(url).set(database=stand_in).render_as_string(hide_password=False)
    return rendered.replace(f"/{stand_in}", "/" + quote(name, safe=""), 1)


def psql_target(url: str, psql_args: Sequence[str]) -> tuple[str, list[str]]:
    """(the URL psql connects to, the arguments psql gets): a ``-d NAME``/``--dbname NAME`` in
    ``psql_args`` is taken out and names another database on ``url``'s server; psql would
    read it as the whole connection instead, on its default socket.

    A connection string given as the name (``-d postgresql://…``, ``-d 'host=… dbname=…'``)
    is refused (psql would take it for the whole connection, and get the platform's password).
    Errors never show ``url`` or the name: either may hold a password."""
    name, rest = _split_dbname(psql_args)
    if name is None:
        return url, rest
    if "=" in name or re.match(r"postgres(ql)?://", name):
        raise click.UsageError(
            "-d/--dbname takes a database name on the platform's server, not a connection "
            "string (for another server run psql itself)"
        )
    return _with_database(url, name), rest


@click.command(
    "shell",
    context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False},
)
@click.argument("psql_args", nargs=-1, type=click.UNPROCESSED)
@click.pass_context
def db_shell(ctx: click.Context, psql_args: tuple[str, ...]) -> None:
    """Open psql on the platform database.

    Runs the psql bundled with the embedded server, with PSQL_ARGS passed on: sluice db
    shell -c 'select 1', sluice db shell -f tables.sql. -d NAME (--dbname NAME) opens
    another database on the same server. Starts the home's embedded PostgreSQL if it is
    stopped. The password goes to psql through the environment (PGPASSWORD), never on its
    command line.
    """
    bare, password = split_password(_libpq_url(_settings(ctx)))
    target, args = psql_target(bare, psql_args)
    env = dict(os.environ)
    if password is not None:
        env["PGPASSWORD"] = password
    psql = psql_path()
    # psql replaces this process: its exit code, signals (Ctrl-C) and terminal are the user's.
    os.execve(psql, [psql, "--dbname", target, *args], env)  # noqa: S606 (no shell: argv as given)


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
