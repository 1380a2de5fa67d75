"""Where a CDC source's tables, publication and slot are: the platform database, or the
database whose URL the environment variable named by ``PostgresCdcSource(url_env)`` holds.

Sluice's own records of the source (its splits, its discovery cursor, which pipeline owns
which slot) always stay in the platform database; only the tables, the publication, the
slot and the WAL are on the source server. The URL is read where it is used — the driver's
environment for discovery, status, checks and ``sluice cdc drop``, each task's environment
for the chunk and stream readers — so it never enters a plan, a task's closure or a log
(what is shown of it goes through ``redact_url``).

A task's readers connect with ``connect_patiently``: Spark retries a failed task at once, so
without waiting, a server restart of a few seconds used up every attempt of the run.

Threading: ``source_engine`` may be called from any thread (one engine per URL and process,
created under a lock); engines are SQLAlchemy's (thread-safe pools). ``connect_patiently``
blocks the calling thread (a reader's fetcher thread) for at most ``CONNECT_PATIENCE`` s.
"""

from __future__ import annotations

import os
import re
import threading
import time
from collections.abc import Callable
from typing import TypeVar

import psycopg
import psycopg2
from sqlalchemy.engine import Engine

from enumerator_service import (
    ConfigError,
    ServerUnreachable,
    asyncpg_dsn,
    connect_engine,
    redact_text,
    redact_url,
    refused_by_server,
)

__all__ = [
    "CONNECT_PATIENCE",
    "PLATFORM",
    "SETTING",
    "check_env_name",
    "connect_patiently",
    "source_engine",
    "task_dsn",
    "where_of",
]

_T = TypeVar("_T")

#: Seconds a task's reader waits for a server that does not answer (a restart) to come back.
CONNECT_PATIENCE = 30.0
#: What a connection error names for the platform database: (setting, prefix of the line).
PLATFORM = ("SLUICE_DATABASE_URL", "")

#: The setting named by every error about the source database's URL.
SETTING = "PostgresCdcSource(url_env)"

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_engines: dict[str, Engine] = {}
_engines_lock = threading.Lock()


def check_env_name(name: object) -> str | None:
    """``url_env`` as the definition gives it: None (the platform database) or the name of
    an environment variable (ValueError otherwise: the caller names the setting)."""
    if name is None:
        return None
    if not isinstance(name, str) or not _ENV_NAME.fullmatch(name):
        raise ValueError(
            f"url_env must be the name of an environment variable (letters, digits and _),"
            f" not {name!r}"
        )
    return name


def _url(url_env: str) -> str:
    """The URL in ``$url_env`` as libpq takes it; ConfigError naming the setting and the
    variable when it is unset, empty or unreadable (never the value: it may hold a
    password)."""
    url = os.environ.get(url_env, "").strip()
    if not url:
        raise ConfigError(
            SETTING,
            f"environment variable {url_env} is not set: it must hold the URL of the source"
            " database (postgresql://user@host:port/dbname) on the driver and on every"
            " Spark executor",
        )
    if not url.startswith(("postgresql://", "postgres://", "postgresql+")):
        raise ConfigError(
            SETTING, f"{url_env} does not hold a postgresql:// URL of the source database"
        )
    try:
        return asyncpg_dsn(url)
    except Exception:  # the parser's message may quote the URL
        raise ConfigError(SETTING, f"{url_env} does not hold a readable URL") from None


def source_engine(url_env: str | None, platform: Engine) -> Engine:
    """The engine of the source database: ``platform`` itself when ``url_env`` is None,
    else one engine per URL for the process (connected and checked the first time:
    ConfigError naming the setting when unreachable)."""
    if url_env is None:
        return platform
    url = _url(url_env)
    with _engines_lock:
        engine = _engines.get(url)
        if engine is None:
            try:
                engine = connect_engine(url, pool_size=2, setting=SETTING)
            except ConfigError as exc:  # (the URL shown without its password)
                raise type(exc)(SETTING, f"{url_env}: {exc.problem}") from None
            _engines[url] = engine
    return engine


def where_of(url_env: str | None) -> tuple[str, str]:
    """What a connection error to the source names: the setting and the variable."""
    return PLATFORM if url_env is None else (SETTING, f"{url_env}: ")


def connect_patiently(
    connect: Callable[[], _T],
    dsn: str,
    where: tuple[str, str] = PLATFORM,
    patience: float = CONNECT_PATIENCE,
) -> _T:
    """``connect()`` (psycopg or psycopg2 to ``dsn``), tried again while the server does not
    answer, for at most ``patience`` s; then ServerUnreachable naming ``where`` (setting,
    variable) and the URL without its password. A server refusing the user, the password
    or the database is not waited for: ConfigError."""
    deadline = time.monotonic() + patience
    delay = 0.1
    while True:
        try:
            return connect()
        except (psycopg.OperationalError, psycopg2.OperationalError) as exc:
            reason = " ".join(str(exc).split())
            refused = refused_by_server(reason)
            if not refused and time.monotonic() + delay <= deadline:
                time.sleep(delay)
                delay = min(2 * delay, 2.0)
                continue
            setting, prefix = where
            error = ConfigError if refused else ServerUnreachable
            line = f"{prefix}cannot connect to {redact_url(dsn)}: {redact_text(reason, dsn)}"
            raise error(setting, line) from None


def task_dsn(url_env: str | None, platform_dsn: str) -> str:
    """The libpq DSN a task's readers connect to the source with: ``platform_dsn`` (the
    platform database, its password already resolved in the task) when ``url_env`` is
    None, else the URL in the task's own environment."""
    return platform_dsn if url_env is None else _url(url_env)
