"""``bench/e2e.py``: where the CDC rows' tables are.

The target row's tables are on **a Postgres server of their own** on this machine (a second
embedded server under ``<SLUICE_HOME>/cdc-source``), read through
``PostgresCdcSource(url_env=SOURCE_URL_ENV)``: the layout of a pipeline that captures an
operational database, which is not the database Sluice keeps its state and its
``PostgresSink`` in. One more row has the table in the platform database itself (no
``url_env``); there the slot's server process also reads through the sink's and Sluice's
own WAL, and the server's backends do both sides' work.

``own_server`` is entered into the bench's ``ExitStack`` before Spark starts: the variable
must be in the environment Spark's Python workers inherit. The server is stopped with the
stack.

Threading: main thread only.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import sqlalchemy as sa

from enumerator_service import Settings, asyncpg_dsn, connect_engine
from enumerator_service._embedded import start_embedded, stop_embedded
from enumerator_service._operations import Platform

__all__ = ["SOURCE_URL_ENV", "CdcSource", "own_server", "platform_source"]

#: The variable the bench's CDC pipelines name in ``url_env`` (set by ``own_server``).
SOURCE_URL_ENV = "SLUICE_BENCH_CDC_SOURCE_URL"


@dataclass(frozen=True)
class CdcSource:
    """The database a round's table is in: its engine, libpq URL and the ``url_env`` the
    pipelines name (None: the platform database); ``kind`` prefixes the rows' kinds and
    ``label`` their labels."""

    engine: sa.Engine
    url: str
    url_env: str | None
    kind: str
    label: str


@contextlib.contextmanager
def own_server(home: Path) -> Iterator[CdcSource]:
    """A second embedded server (started, ``wal_level=logical``), its URL in
    ``SOURCE_URL_ENV``; stopped, and the variable removed, at the end."""
    settings = Settings(home=home / "cdc-source", database_url=None)
    url = asyncpg_dsn(start_embedded(settings, create=True))
    engine = connect_engine(url, pool_size=2)
    os.environ[SOURCE_URL_ENV] = url
    try:
        yield CdcSource(engine, url, SOURCE_URL_ENV, "cdc", "")
    finally:
        os.environ.pop(SOURCE_URL_ENV, None)
        engine.dispose()
        stop_embedded(settings)


def platform_source(platform: Platform) -> CdcSource:
    """The platform database as the source (the informational row)."""
    url = asyncpg_dsn(platform.url)
    return CdcSource(
        platform.engine, url, None, "cdc-platform", " (source in the platform database)"
    )
