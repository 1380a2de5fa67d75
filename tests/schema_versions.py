"""A database of its own at an older schema revision (a platform migrated by an older Sluice)."""

from __future__ import annotations

import contextlib
import secrets
from collections.abc import Iterator

import sqlalchemy as sa
from sqlalchemy.engine import make_url

from enumerator_service import connect_engine, upgrade_schema
from enumerator_service._database import schema_revision

#: An older revision than head (every later migration is pending on it).
OLD_REVISION = "0005"


@contextlib.contextmanager
def database_at(server_url: str, revision: str | None) -> Iterator[str]:
    """The URL of a new database on ``server_url`` migrated to ``revision`` (None: empty),
    dropped afterwards."""
    name = f"sluice_old_{secrets.token_hex(4)}"
    admin = sa.create_engine(
        make_url(server_url).set(drivername="postgresql+psycopg"), isolation_level="AUTOCOMMIT"
    )
    with admin.connect() as conn:
        conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
    url = make_url(server_url).set(database=name).render_as_string(hide_password=False)
    try:
        if revision is not None:
            engine = connect_engine(url, pool_size=1)
            try:
                upgrade_schema(engine, revision)
            finally:
                engine.dispose()
        yield url
    finally:
        with admin.connect() as conn:
            conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


def revision_of(url: str) -> str | None:
    engine = connect_engine(url, pool_size=1)
    try:
        return schema_revision(engine)
    finally:
        engine.dispose()
