"""How a reader task reaches the platform database without its password in the closure.

Spark pickles a task's closure (the :class:`~spark_jobs.jobs._task_config.TaskConfig`) and
ships it to executors, shows it in logs at DEBUG, and keeps it in event logs: it must not hold
the password. It holds a :class:`WorkerDatabase` instead: the URL without its password, and
where the executor finds the password:

1. ``password_file`` (a path on the executor): ``SLUICE_DATABASE_PASSWORD_FILE`` when set
   (a secret mounted at the same path on every machine); with a local master and no such
   file, the driver writes the password to a 0600 file under ``<SLUICE_HOME>/secrets`` for
   the run and deletes it when the run ends (local workers see the driver's disk, whatever
   their environment).
2. Otherwise the executor's environment: ``SLUICE_DATABASE_PASSWORD``, then
   ``SLUICE_DATABASE_PASSWORD_FILE``, then the password of ``SLUICE_DATABASE_URL``.

Nothing is put in ``spark.executorEnv.*``: Spark shows its conf in the UI and event logs.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from enumerator_service import (
    SECRETS_FOLDER,
    ConfigError,
    Settings,
    asyncpg_dsn,
    new_secret_file,
    read_password_file,
    redact_url,
    split_password,
    with_password,
)

__all__ = ["WorkerDatabase", "share_database"]


@dataclass(frozen=True, slots=True)
class WorkerDatabase:
    """The platform database as a task sees it: ``url`` has no password; ``needs_password``
    says the driver's URL had one, ``password_file`` where to read it (None: from the
    executor's environment)."""

    url: str
    needs_password: bool = False
    password_file: str | None = None

    def __repr__(self) -> str:
        return (
            f"WorkerDatabase(url={redact_url(self.url)!r}, "
            f"needs_password={self.needs_password}, password_file={self.password_file!r})"
        )

    def resolve(self) -> str:
        """The URL with its password, read on this executor; ConfigError (naming the setting
        to set) when the password is nowhere to be found."""
        if not self.needs_password:
            return self.url
        return with_password(self.url, self._password())

    def asyncpg_dsn(self) -> str:
        return asyncpg_dsn(self.resolve())

    def _password(self) -> str:
        if self.password_file is not None:
            return read_password_file(Path(self.password_file))
        env = os.environ
        if env.get("SLUICE_DATABASE_PASSWORD"):
            return env["SLUICE_DATABASE_PASSWORD"]
        if env.get("SLUICE_DATABASE_PASSWORD_FILE"):
            return read_password_file(Path(env["SLUICE_DATABASE_PASSWORD_FILE"]))
        if env.get("SLUICE_DATABASE_URL"):
            try:
                _, password = split_password(env["SLUICE_DATABASE_URL"])
            except ValueError:
                password = None
            if password:
                return password
        raise ConfigError(
            "SLUICE_DATABASE_PASSWORD",
            "the database password is not available on this executor: set "
            "SLUICE_DATABASE_PASSWORD or SLUICE_DATABASE_PASSWORD_FILE in the executors' "
            "environment",
        )


def share_database(settings: Settings, url: str) -> tuple[WorkerDatabase, Callable[[], None]]:
    """The :class:`WorkerDatabase` of the driver's ``url`` and a callback that removes what
    sharing it left behind (the run's password file; call it when the run ends)."""
    bare, password = split_password(url)
    if password is None:
        return WorkerDatabase(bare), lambda: None
    if settings.database_password_file is not None:
        path = settings.database_password_file.absolute()
        return WorkerDatabase(bare, True, str(path)), lambda: None
    if not settings.spark_master.startswith("local"):
        return WorkerDatabase(bare, True), lambda: None
    folder = settings.home_path / SECRETS_FOLDER
    path = new_secret_file(settings.home_path)
    try:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        folder.chmod(0o700)
        # O_EXCL + 0600 from the start: never readable by others, not even briefly.
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as file:
            file.write(password + "\n")
    except OSError as exc:
        raise ConfigError("SLUICE_HOME", f"cannot write {path}: {exc.strerror}") from None
    return WorkerDatabase(bare, True, str(path)), lambda: path.unlink(missing_ok=True)
