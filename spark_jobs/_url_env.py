"""Databases other than the platform's, named by an environment variable (``url_env``).

A CDC source's tables and a lookup's table may live on an operational server of their own:
the definition names the *environment variable* that holds its URL, never the URL, so that
the URL (and its password) never enters a pipeline definition, a plan, a task's closure or a
log. It is read where it is used — the driver's environment for checks and catalogs, each
Spark task's own for its connections — and shown only through ``redact_url``. ``None``
means the platform database.

Every error names the definition's setting (``PostgresCdcSource(url_env)``,
``Lookup(url_env)``) and the variable, never its value.

Threading: ``engine_of`` may be called from any thread (one engine per URL and process,
created under a lock); engines are SQLAlchemy's (thread-safe pools).
"""

from __future__ import annotations

import os
import re
import threading

from sqlalchemy.engine import Engine

from enumerator_service import ConfigError, asyncpg_dsn, connect_engine

__all__ = [
    "LOOKUP_URL_SETTING",
    "PLATFORM",
    "check_env_name",
    "database_note",
    "engine_of",
    "named_engine",
    "task_dsn",
    "url_of",
    "where_of",
]

#: What a connection error names for the platform database: (setting, prefix of the line).
PLATFORM = ("SLUICE_DATABASE_URL", "")
#: The setting errors about a lookup table's database name.
LOOKUP_URL_SETTING = "Lookup(url_env)"

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_engines: dict[str, Engine] = {}
_engines_lock = threading.Lock()


def check_env_name(name: object) -> str | None:
    """``url_env`` as a definition gives it: None (the platform database) or the name of an
    environment variable (ValueError otherwise: the caller names the setting)."""
    if name is None:
        return None
    if isinstance(name, str) and ("://" in name or "@" in name):
        # (a URL given by mistake is not repeated: it may hold a password)
        raise ValueError(
            "url_env must be the name of the environment variable that holds the URL, not"
            " the URL itself"
        )
    if not isinstance(name, str) or not _ENV_NAME.fullmatch(name):
        raise ValueError(
            f"url_env must be the name of an environment variable (letters, digits and _),"
            f" not {name!r}"
        )
    return name


def url_of(url_env: str, setting: str) -> str:
    """The URL in ``$url_env`` as libpq takes it; ConfigError naming ``setting`` and the
    variable when it is unset, empty or unreadable (never the value: it may hold a
    password)."""
    url = os.environ.get(url_env, "").strip()
    if not url:
        raise ConfigError(
            setting,
            f"environment variable {url_env} is not set: it must hold the URL of the"
            " database (postgresql://user@host:port/dbname) on the driver and on every"
            " Spark executor",
        )
    if not url.startswith(("postgresql://", "postgres://", "postgresql+")):
        raise ConfigError(setting, f"{url_env} does not hold a postgresql:// URL")
    try:
        return asyncpg_dsn(url)
    except Exception:  # the parser's message may quote the URL
        raise ConfigError(setting, f"{url_env} does not hold a readable URL") from None


def database_note(url_env: str | None) -> str:
    """`` (database in $VAR)`` after a table's name in a message, or nothing (the platform
    database)."""
    return f" (database in ${url_env})" if url_env else ""


def engine_of(url_env: str | None, platform: Engine, setting: str) -> Engine:
    """The engine of the database in ``$url_env``: ``platform`` itself when ``url_env`` is
    None, else :func:`named_engine`."""
    return platform if url_env is None else named_engine(url_env, setting)


def named_engine(url_env: str, setting: str) -> Engine:
    """The engine of the database in ``$url_env``, one per URL for the process (connected
    and checked the first time: ConfigError naming ``setting`` when refused,
    ServerUnreachable when it does not answer)."""
    url = url_of(url_env, setting)
    with _engines_lock:
        engine = _engines.get(url)
        if engine is None:
            try:
                engine = connect_engine(url, pool_size=2, setting=setting)
            except ConfigError as exc:  # (the URL shown without its password)
                raise type(exc)(setting, f"{url_env}: {exc.problem}") from None
            _engines[url] = engine
    return engine


def where_of(url_env: str | None, setting: str) -> tuple[str, str]:
    """What a connection error names: the setting and the variable (or the platform's)."""
    return PLATFORM if url_env is None else (setting, f"{url_env}: ")


def task_dsn(url_env: str | None, platform_dsn: str, setting: str) -> str:
    """The libpq DSN a task connects with: ``platform_dsn`` (the platform database, its
    password already resolved in the task) when ``url_env`` is None, else the URL in the
    task's own environment."""
    return platform_dsn if url_env is None else url_of(url_env, setting)
