"""A Lookup whose table is on another server (``Lookup(url_env=...)``): a second embedded
Postgres plays the operational database (a role with a password in its URL), while the
platform database holds a *decoy* table of the same name with other values — so every name
in the output proves which server answered.

Through the CLI as a user runs it: the output equals the oracle built from the operational
table, without a cache and with a full cache; keys missing there are dead letters; ``sluice
pipelines`` says where the table is; the password appears in no output. Without the
variable, or with the table missing on that server, the run is one line naming the setting
and exit code 2. Dagster's asset of the table is keyed by the variable and observed on its
own server.
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pyarrow.dataset as ds
import pytest
import sqlalchemy as sa
from cli_env import run_sluice
from dagster import AssetSelection, Definitions, define_asset_job
from sluice_resource import resource_for
from sqlalchemy.engine import make_url

from dagster_project.observations import table_asset
from enumerator_service import Settings, connect_engine
from enumerator_service._embedded import start_embedded, stop_embedded

pytestmark = pytest.mark.spark

PASSWORD = f"pw-{secrets.token_hex(6)}"
VARIABLE = "CRM_DB_URL"
CUSTOMERS = 300  # ids 1..300 on the operational server; orders also name ids 301..310

MODULE = """
from spark_jobs import FileSource, FullCache, Lookup, ParquetSink, Pipeline

def _orders(name, cache):
    return Pipeline(
        name=name,
        source=FileSource(landing="{landing}", schema={{"order": "string", "customer": "int64"}}),
        steps=[Lookup("crm.customers", on={{"customer": "id"}}, columns={{"name": "customer_name"}},
                      on_miss="dead_letter", url_env="{variable}", cache=cache)],
        sink=ParquetSink(name),
    )

plain = _orders("{name}_plain", None)
cached = _orders("{name}_cached", FullCache())
"""


@pytest.fixture(scope="module")
def crm_server() -> Iterator[str]:
    """A second embedded server, stopped at the end: the URL of its ``postgres`` database as
    the role ``reader`` (password; SELECT on ``crm.customers``, which ``crm`` owns)."""
    home = Path(tempfile.mkdtemp(prefix="sl-crm-", dir="/tmp"))  # short: a Unix socket path
    settings = Settings(home=home, database_url=None)
    admin = connect_engine(start_embedded(settings, create=True), pool_size=1)
    try:
        with admin.begin() as conn:
            conn.execute(sa.text(f"CREATE ROLE crm LOGIN PASSWORD '{PASSWORD}'"))
            conn.execute(sa.text(f"CREATE ROLE reader LOGIN PASSWORD '{PASSWORD}'"))
            conn.execute(sa.text("CREATE SCHEMA crm AUTHORIZATION crm"))
        url = make_url(str(admin.url)).set(username="crm", password=PASSWORD)
        crm = url.set(drivername="postgresql").render_as_string(hide_password=False)
        engine = connect_engine(crm, pool_size=1)
        with engine.begin() as conn:
            conn.execute(sa.text("CREATE TABLE crm.customers (id bigint PRIMARY KEY, name text)"))
            conn.execute(
                sa.text(
                    "INSERT INTO crm.customers SELECT g, 'crm-' || g FROM generate_series(1, :n) g"
                ),
                {"n": CUSTOMERS},
            )
            # The pipeline reads as a role with nothing but SELECT (what the docs say it needs).
            conn.execute(sa.text("GRANT USAGE ON SCHEMA crm TO reader"))
            conn.execute(sa.text("GRANT SELECT ON crm.customers TO reader"))
        engine.dispose()
        yield url.set(username="reader", drivername="postgresql").render_as_string(
            hide_password=False
        )
    finally:
        admin.dispose()
        stop_embedded(settings)
        shutil.rmtree(home, ignore_errors=True)


def _sluice(args: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return run_sluice(args, env, cwd, unset=(VARIABLE,), secret=PASSWORD)


@pytest.fixture(scope="module")
def setup(
    crm_server: str, db_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[dict[str, str], Path, str, dict[str, str | None]]]:
    """Landing files, the decoy table in the platform database, the user's module; the
    oracle: order -> the customer's name on the operational server (None: no such id)."""
    root = tmp_path_factory.mktemp("lookup_url_env")
    name = f"crm_{secrets.token_hex(3)}"
    landing = root / "landing"
    oracle: dict[str, str | None] = {}
    for day, first in (("2026-03-01", 1), ("2026-03-02", 200)):
        folder = landing / f"dt={day}"
        folder.mkdir(parents=True)
        lines = []
        for i in range(first, first + 111):
            order = f"o{i:05d}"
            oracle[order] = f"crm-{i}" if i <= CUSTOMERS else None
            lines.append(orjson.dumps({"order": order, "customer": i}))
        (folder / "part-0.jsonl").write_bytes(b"\n".join(lines) + b"\n")
    platform = connect_engine(db_url, pool_size=1)
    with platform.begin() as conn:  # the decoy: same name, other values, every id
        conn.execute(sa.text("CREATE SCHEMA IF NOT EXISTS crm"))
        conn.execute(sa.text("DROP TABLE IF EXISTS crm.customers"))
        conn.execute(sa.text("CREATE TABLE crm.customers (id bigint PRIMARY KEY, name text)"))
        conn.execute(
            sa.text(
                "INSERT INTO crm.customers SELECT g, 'decoy-' || g FROM generate_series(1, 999) g"
            )
        )
    platform.dispose()
    module = MODULE.format(landing=landing, variable=VARIABLE, name=name)
    (root / "crm_pipelines.py").write_text(module)
    env = {
        "SLUICE_PIPELINES": "crm_pipelines",
        "SLUICE_DATABASE_URL": db_url,
        "SLUICE_HOME": str(root / "home"),
        "SLUICE_DATA_DIR": str(root / "data"),
        "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")]),
        VARIABLE: crm_server,
    }
    yield env, root, name, oracle
    # The decoy goes: the orders example fills crm.customers of this database with its own
    # sample rows (and refuses a table it did not create).
    platform = connect_engine(db_url, pool_size=1)
    with platform.begin() as conn:
        conn.execute(sa.text("DROP TABLE IF EXISTS crm.customers"))
    platform.dispose()


@pytest.mark.parametrize("variant", ["plain", "cached"])
def test_a_lookup_reads_its_table_on_the_server_of_its_url_env(setup: Any, variant: str) -> None:
    env, root, name, oracle = setup
    pipeline = f"{name}_{variant}"
    for command in ("discover", "run"):
        done = _sluice([command, pipeline], env, root)
        assert done.returncode == 0, done.stderr[-3000:]
    output = ds.dataset(
        root / "data" / "warehouse" / pipeline, format="parquet", partitioning="hive"
    )
    rows = {r["order"]: r["customer_name"] for r in output.to_table().to_pylist()}
    assert rows == {order: found for order, found in oracle.items() if found is not None}
    missing = [order for order, found in oracle.items() if found is None]
    platform = connect_engine(env["SLUICE_DATABASE_URL"], pool_size=1)
    try:
        with platform.connect() as conn:
            reasons = conn.execute(
                sa.text("SELECT reason FROM sluice.dead_letters WHERE source = :s"),
                {"s": pipeline},
            ).scalars()
            assert sorted(reasons) == sorted(
                f"lookup miss: crm.customers has no row for customer={int(order[1:])}"
                for order in missing
            )
    finally:
        platform.dispose()


def test_pipelines_says_where_the_table_is(setup: Any) -> None:
    env, root, _, _ = setup
    shown = _sluice(["pipelines"], {**env, "COLUMNS": "300"}, root)
    assert shown.returncode == 0, shown.stderr
    assert f"Lookup crm.customers (database in ${VARIABLE}) on customer=id" in shown.stdout


def test_without_the_variable_or_the_table_the_run_is_one_line(setup: Any, crm_server: str) -> None:
    env, root, name, _ = setup
    unset = {k: v for k, v in env.items() if k != VARIABLE}
    done = _sluice(["run", f"{name}_plain"], unset, root)
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines() == [
        f"sluice: configuration error: Lookup(url_env): environment variable {VARIABLE} is not"
        " set: it must hold the URL of the database (postgresql://user@host:port/dbname) on the"
        " driver and on every Spark executor"
    ]
    elsewhere = {**env, VARIABLE: crm_server.replace("/postgres", "/template1")}
    done = _sluice(["run", f"{name}_plain"], elsewhere, root)
    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert f"table crm.customers (database in ${VARIABLE}) does not exist" in line, line


def test_the_dagster_asset_of_the_table_is_observed_on_its_server(
    setup: Any, crm_server: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    env, root, name, _ = setup
    monkeypatch.setenv(VARIABLE, crm_server)
    asset = table_asset("crm", "customers", group=name, used_by=name, url_env=VARIABLE)
    assert asset.key.path == [VARIABLE, "crm", "customers"]
    settings = Settings(database_url=env["SLUICE_DATABASE_URL"], home=root / "home")
    job = define_asset_job("observe", selection=AssetSelection.assets(asset))
    defs = Definitions(assets=[asset], jobs=[job], resources={"sluice": resource_for(settings)})
    result = defs.resolve_job_def("observe").execute_in_process()
    (event,) = [e for e in result.all_events if e.event_type_value == "ASSET_OBSERVATION"]
    metadata = {
        k: v.value for k, v in event.asset_observation_data.asset_observation.metadata.items()
    }
    # The operational table (300 rows), not the platform's decoy (999).
    assert metadata["exists"] is True and metadata["row_count"] == CUSTOMERS


def test_pipelines_with_the_server_down_is_an_outage_not_a_definition_error(setup: Any) -> None:
    env, root, _, _ = setup
    down = {**env, VARIABLE: f"postgresql://reader:{PASSWORD}@127.0.0.1:1/postgres"}
    shown = _sluice(["pipelines"], {**down, "COLUMNS": "300"}, root)
    assert shown.returncode == 1, (shown.stdout, shown.stderr)
    assert shown.stderr.strip().splitlines()[-1] == (
        "sluice: unreachable: 2 pipeline(s) read a database that did not answer, shown above"
    )
    assert "definition error" not in shown.stderr
