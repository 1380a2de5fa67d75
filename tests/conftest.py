"""Shared fixtures: a real Postgres (embedded, or SLUICE_DATABASE_URL) with a fresh database.

The suite creates one database per test session (``sluice_test_<random>``) on the server,
migrated to head, and drops it afterwards, so it never touches data in the server's other
databases. With ``SLUICE_DATABASE_URL`` set, that server is used and its role needs CREATEDB.

The embedded server (``<repo>/.sluice/test``, or ``SLUICE_TEST_HOME``) is stopped when the
session ends, passed or failed, unless another live test session still uses it (each session
registers its pid under ``<home>/pg-sessions`` while it runs).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import secrets
from collections.abc import Iterator
from datetime import date
from pathlib import Path
from typing import Literal

import pytest
import sqlalchemy as sa
from pydantic import ValidationError
from sqlalchemy.engine import make_url

from enumerator_service import ConfigError, Settings
from enumerator_service._database import connect_engine, database_url, upgrade_schema
from enumerator_service._embedded import stop_embedded

REPO = Path(__file__).resolve().parents[1]

# Tests write landing files and discover them at once: no settle time unless a test asks for
# one (the settle rule has its own tests; subprocesses inherit this).
os.environ.setdefault("SLUICE_FILE_SETTLE_SECONDS", "0")


class TestSettings(Settings):
    """Settings plus what a test varies on its own: the split source (the name of the test's
    pipeline) and the folders of the demo pipeline built for it (``demo_platform``)."""

    __test__ = False  # not a test class

    source_name: str = "events"
    # Most Dagster tests launch a partition by key before any sensor tick could add it, so
    # they run on daily partitions; the shipped default (discovered) is tested by the tests
    # that pass dagster_partitions="discovered" (the reporter's, the issue-14 acceptance).
    dagster_partitions: Literal["daily", "discovered"] = "daily"

    @property
    def landing_path(self) -> Path:
        return self.data_path / "landing" / self.source_name

    @property
    def output_path(self) -> Path:
        return self.warehouse_path / f"enriched_{self.source_name}"


def load_test_settings(**overrides: object) -> TestSettings:
    """Like ``load_settings``: a bad value is a one-line ConfigError."""
    try:
        return TestSettings(**overrides)  # type: ignore[arg-type]
    except ValidationError as exc:
        error = exc.errors()[0]
        field = str(error["loc"][0]) if error["loc"] else "settings"
        raise ConfigError(f"SLUICE_{field.upper()}", str(error["msg"])) from None


@contextlib.contextmanager
def _sessions_lock(home: Path) -> Iterator[Path]:
    """The folder of the sessions using ``home``'s server, under an exclusive lock (a session
    never starts the server while another one is stopping it)."""
    folder = home / "pg-sessions"
    folder.mkdir(parents=True, exist_ok=True)
    with (home / "pg-sessions.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield folder
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@contextlib.contextmanager
def embedded_test_server(home: Path) -> Iterator[str]:
    """The embedded server of ``home`` for one test session: started (or reused), and stopped
    at the end, also when tests failed, unless another live session still uses it.

    A session that was SIGKILLed leaves its pid file behind; the next session to end prunes
    it and stops the server.
    """
    settings = Settings(home=home, database_url=None)
    mine = f"{os.getpid()}"
    with _sessions_lock(home) as sessions:
        url = database_url(settings)
        (sessions / mine).touch()
    try:
        yield url
    finally:
        with _sessions_lock(home) as sessions:
            (sessions / mine).unlink(missing_ok=True)
            others = []
            for entry in sessions.iterdir():
                if entry.name.isdigit() and _alive(int(entry.name)):
                    others.append(entry.name)
                else:
                    entry.unlink(missing_ok=True)
            if not others:
                stop_embedded(settings)


@pytest.fixture(scope="session")
def server_url() -> Iterator[str]:
    """URL of the Postgres server under test (its default database)."""
    if os.environ.get("SLUICE_DATABASE_URL"):
        yield os.environ["SLUICE_DATABASE_URL"]
        return
    # Short path: the embedded server's Unix socket path must stay under ~100 bytes.
    home = Path(os.environ.get("SLUICE_TEST_HOME", str(REPO / ".sluice" / "test")))
    with embedded_test_server(home) as url:
        yield url


@pytest.fixture(scope="session")
def db_url(server_url: str) -> Iterator[str]:
    """A fresh database for this test session, migrated to head (as ``sluice db upgrade``
    leaves it: commands other than ``db upgrade``, ``demo`` and ``run`` only check it)."""
    name = f"sluice_test_{secrets.token_hex(4)}"
    admin = sa.create_engine(
        make_url(server_url).set(drivername="postgresql+psycopg"), isolation_level="AUTOCOMMIT"
    )
    with admin.connect() as conn:
        conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
    url = make_url(server_url).set(database=name).render_as_string(hide_password=False)
    engine = connect_engine(url, pool_size=1)
    try:
        upgrade_schema(engine)
    finally:
        engine.dispose()
    yield url
    with admin.connect() as conn:
        # A logical replication slot (a CDC source's) keeps its database from being dropped.
        conn.execute(
            sa.text(
                "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots"
                " WHERE database = :name AND active_pid IS NOT NULL"
            ),
            {"name": name},
        )
        conn.execute(
            sa.text(
                "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots"
                " WHERE database = :name"
            ),
            {"name": name},
        )
        conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    admin.dispose()


@pytest.fixture
def make_settings(db_url: str, tmp_path: Path) -> object:
    """Factory of Settings on the test database with data under ``tmp_path``."""

    def factory(**overrides: object) -> TestSettings:
        base: dict[str, object] = {
            "database_url": db_url,
            "home": tmp_path / "home",
            "data_dir": tmp_path / "data",
            # A source of its own per test: splits, cursors and dead letters never mix.
            "source_name": f"ev_{secrets.token_hex(3)}",
            "spark_master": "local[2]",
            "parallelism": 2,
            "demo_events": 3000,
            "demo_users": 5000,
            "demo_days": 2,
            "demo_files_per_day": 3,
            "demo_start_date": date(2026, 1, 1),
        }
        base.update(overrides)
        return load_test_settings(**base)

    return factory
