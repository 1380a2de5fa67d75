"""The run password files under ``<SLUICE_HOME>/secrets`` and their sweep.

A driver with a local master leaves the database password for its workers in a 0600 file
(``spark_jobs.jobs._credentials``) and deletes it when the run ends. A driver that is killed
(SIGKILL, OOM, a power cut) cannot: :func:`sweep_secret_files` runs at every start (the CLI,
a Dagster resource's setup, a job driver) and removes the files whose owner is gone.

The owner is in the name: ``db-<pid>-<start>-<random>.password``, ``<start>`` being the
process's start time in clock ticks since boot (``/proc/<pid>/stat``; 0 where there is no
``/proc``). A file is stale when no process ``<pid>`` runs, or one does that started at
another time (the pid was reused). Files named the old way (``db-<random>.password``, no
owner) are removed once older than ``max_age_seconds``. Other files are never touched.

The sweep only ever sees names and modification times, never the files' contents: nothing
it logs or raises can hold a password.

Threading: any thread; concurrent sweeps are harmless (a missing file is not an error).
"""

from __future__ import annotations

import logging
import os
import re
import secrets
import time
from pathlib import Path

__all__ = ["SECRETS_FOLDER", "new_secret_file", "sweep_secret_files"]

_log = logging.getLogger(__name__)

#: Under SLUICE_HOME: where a driver with a local master leaves a run's password.
SECRETS_FOLDER = "secrets"
_OWNED = re.compile(r"^db-(\d+)-(\d+)-[0-9a-f]+\.password$")
_UNOWNED = re.compile(r"^db-[0-9a-f]+\.password$")
#: Files without an owner in their name: removed after a day (no run's password lives that
#: long in a file of this kind without its driver having been restarted since).
DEFAULT_MAX_AGE_SECONDS = 24 * 3600.0


def _start_time(pid: int) -> int | None:
    """The start time of process ``pid`` (clock ticks after boot): 0 without ``/proc``, None
    when no such process runs."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as file:
            stat = file.read()
    except FileNotFoundError:
        if os.path.isdir("/proc/self"):
            return None  # /proc works: the process is gone
        return 0 if _exists(pid) else None
    except OSError:
        return 0  # unreadable (hidepid): assume it runs, keep its file
    # Field 22; the name (field 2, in parentheses) may hold spaces and parentheses.
    fields = stat[stat.rindex(b")") + 2 :].split()
    return int(fields[19])


def _exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process
    return True


def new_secret_file(home: Path) -> Path:
    """A new, not yet created path for this process's password file under ``home``."""
    pid = os.getpid()
    start = _start_time(pid) or 0
    return home / SECRETS_FOLDER / f"db-{pid}-{start}-{secrets.token_hex(8)}.password"


def _stale(name: str, mtime: float, now: float, max_age: float) -> bool:
    owned = _OWNED.match(name)
    if owned is not None:
        pid, start = int(owned.group(1)), int(owned.group(2))
        running = _start_time(pid)
        return running is None or (start != 0 and running not in (0, start))
    return _UNOWNED.match(name) is not None and now - mtime > max_age


def sweep_secret_files(
    home: Path, *, max_age_seconds: float = DEFAULT_MAX_AGE_SECONDS, now: float | None = None
) -> int:
    """Remove the password files under ``home`` whose driver is gone (see the module
    docstring); returns how many. Never raises for a file it cannot remove (logged)."""
    folder = home / SECRETS_FOLDER
    now = time.time() if now is None else now
    removed = 0
    try:
        entries = list(os.scandir(folder))
    except FileNotFoundError:
        return 0
    except OSError as exc:
        _log.warning("cannot list %s to sweep stale password files: %s", folder, exc.strerror)
        return 0
    for entry in entries:
        try:
            if not entry.is_file(follow_symlinks=False):
                continue
            mtime = entry.stat(follow_symlinks=False).st_mtime
            if not _stale(entry.name, mtime, now, max_age_seconds):
                continue
            os.unlink(entry.path)
        except FileNotFoundError:
            continue  # another sweep, or its run ended meanwhile
        except OSError as exc:
            _log.warning("cannot remove the stale password file %s: %s", entry.path, exc.strerror)
            continue
        removed += 1
    if removed:
        _log.info("removed %d stale password file(s) from %s", removed, folder)
    return removed
