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

import time
from collections.abc import Callable
from typing import TypeVar

import psycopg
import psycopg.conninfo
import psycopg2
from sqlalchemy.engine import Engine

from enumerator_service import (
    Backoff,
    ConfigError,
    ServerUnreachable,
    redact_text,
    redact_url,
    refused_by_server,
)
from spark_jobs import _url_env as url_env
from spark_jobs._url_env import PLATFORM

__all__ = [
    "CONNECT_PATIENCE",
    "PLATFORM",
    "SESSION_OPTIONS",
    "SETTING",
    "connect_patiently",
    "session_options",
    "source_engine",
    "task_dsn",
    "where_of",
]

_T = TypeVar("_T")

#: Session settings of the readers' connections (libpq ``options``), whatever the source
#: server, database or role sets: the text of a value that the stream (pgoutput) and the
#: snapshot (``format('%s', col)``, psycopg's text) parse must be the one they expect — dates
#: in ISO form (not ``28/02/2026``), floats round-tripping exactly (``extra_float_digits`` of
#: 0 or less gives 15 significant digits: a changed value), ``bytea`` in hex (not escapes).
SESSION_OPTIONS = "-c datestyle=ISO,YMD -c extra_float_digits=3 -c bytea_output=hex"


def session_options(dsn: str, *more: str) -> str:
    """The ``options`` a reader connects to ``dsn`` with: the URL's own (a user's
    ``?options=-c search_path=...``) first, then ``more``, then ``SESSION_OPTIONS`` (a
    later ``-c`` of a setting wins)."""
    own = psycopg.conninfo.conninfo_to_dict(dsn).get("options")
    return " ".join(str(part) for part in (own, *more, SESSION_OPTIONS) if part)


#: Seconds a task's reader waits for a server that does not answer (a restart) to come back.
CONNECT_PATIENCE = 30.0
#: The setting named by every error about the source database's URL.
SETTING = "PostgresCdcSource(url_env)"


def source_engine(name: str | None, platform: Engine) -> Engine:
    """The engine of the source database: ``platform`` itself when ``name`` is None, else one
    engine per URL for the process (ConfigError naming the setting when unreachable)."""
    return url_env.engine_of(name, platform, SETTING)


def where_of(name: str | None) -> tuple[str, str]:
    """What a connection error to the source names: the setting and the variable."""
    return url_env.where_of(name, SETTING)


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
    backoff = Backoff(patience, clock=time.monotonic)
    while True:
        try:
            return connect()
        except (psycopg.OperationalError, psycopg2.OperationalError) as exc:
            reason = " ".join(str(exc).split())
            refused = refused_by_server(reason)
            delay = None if refused else backoff.next_delay()
            if delay is not None:
                time.sleep(delay)
                continue
            setting, prefix = where
            error = ConfigError if refused else ServerUnreachable
            line = f"{prefix}cannot connect to {redact_url(dsn)}: {redact_text(reason, dsn)}"
            raise error(setting, line) from None


def task_dsn(name: str | None, platform_dsn: str) -> str:
    """The libpq DSN a task's readers connect to the source with: ``platform_dsn`` (the
    platform database) when ``name`` is None, else the URL in the task's own environment."""
    return url_env.task_dsn(name, platform_dsn, SETTING)
