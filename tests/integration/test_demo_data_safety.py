"""``sluice demo-data`` writes only into what sample data created (issue 13).

Pointed at a database with a real ``public.users`` (or a ``ref.fx_rates`` of the same name it
did not create) or at a landing folder with other files, it refuses with one line and exit
code 2, and nothing changes: rows, tables, schemas, files and their bytes. On its own objects
it still works, again and again (the demo, the examples' tests and the fault tests rely on
that), and refills its own table when the sample size changes.

Each test gets a database of its own (the session database's ``public.users`` belongs to the
other tests' demo data).
"""

from __future__ import annotations

import json
import os
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import make_url

from enumerator_service import connect_engine, upgrade_schema
from spark_jobs.cli import main
from spark_jobs.pipeline._demo_marks import DEMO_COMMENT, LANDING_MARKER

SIZES = {
    "SLUICE_DEMO_EVENTS": "300",
    "SLUICE_DEMO_USERS": "40",
    "SLUICE_DEMO_DAYS": "1",
    "SLUICE_DEMO_FILES_PER_DAY": "2",
}


@pytest.fixture
def fresh_url(server_url: str) -> Iterator[str]:
    name = f"sluice_demo_{secrets.token_hex(4)}"
    admin = sa.create_engine(
        make_url(server_url).set(drivername="postgresql+psycopg"), isolation_level="AUTOCOMMIT"
    )
    with admin.connect() as conn:
        conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
    url = make_url(server_url).set(database=name).render_as_string(hide_password=False)
    # Migrated, as `sluice db upgrade` leaves it (demo-data checks the schema, never migrates).
    migrating = connect_engine(url, pool_size=1)
    try:
        upgrade_schema(migrating)
    finally:
        migrating.dispose()
    try:
        yield url
    finally:
        with admin.connect() as conn:
            conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


@pytest.fixture
def engine(fresh_url: str) -> Iterator[sa.Engine]:
    engine = sa.create_engine(make_url(fresh_url).set(drivername="postgresql+psycopg"))
    try:
        yield engine
    finally:
        engine.dispose()


class Demo:
    """``sluice demo-data PIPELINE`` in this process on the fresh database."""

    def __init__(
        self,
        url: str,
        data: Path,
        monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str],
    ) -> None:
        self.data, self._capsys = data, capsys
        for key in [k for k in os.environ if k.startswith("SLUICE_")]:
            monkeypatch.delenv(key)
        env = {
            "SLUICE_DATABASE_URL": url,
            "SLUICE_DATA_DIR": str(data),
            "SLUICE_HOME": str(data.parent / "home"),
            "SLUICE_PIPELINES": "examples.clickstream,examples.orders",
            **SIZES,
        }
        for key, value in env.items():
            monkeypatch.setenv(key, value)
        self._monkeypatch = monkeypatch

    def __call__(self, pipeline: str, command: str = "demo-data", **env: str) -> tuple[int, str]:
        for key, value in env.items():
            self._monkeypatch.setenv(key, value)
        try:
            main([command, pipeline])
            code = 0
        except SystemExit as exc:
            code = int(exc.code or 0)
        captured = self._capsys.readouterr()
        return code, captured.err.strip() if code else captured.out


@pytest.fixture
def demo(
    fresh_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> Demo:
    return Demo(fresh_url, tmp_path / "data", monkeypatch, capsys)


def database(engine: sa.Engine) -> dict[str, Any]:
    """Every user table with its comment and rows, and every schema (the platform's own
    ``sluice`` schema aside: any command migrates it)."""
    with engine.connect() as conn:
        tables = conn.execute(
            sa.text(
                "SELECT table_schema, table_name FROM information_schema.tables"
                " WHERE table_schema NOT IN ('sluice', 'pg_catalog', 'information_schema')"
            )
        ).all()
        found: dict[str, Any] = {
            "schemas": sorted(
                conn.execute(sa.text("SELECT nspname FROM pg_namespace WHERE nspname <> 'sluice'"))
                .scalars()
                .all()
            )
        }
        for schema, table in tables:
            name = f'"{schema}"."{table}"'
            found[f"{schema}.{table}"] = (
                conn.execute(
                    sa.text("SELECT obj_description(to_regclass(:n), 'pg_class')"), {"n": name}
                ).scalar(),
                sorted(tuple(r) for r in conn.execute(sa.text(f"SELECT * FROM {name}"))),
            )
    return found


def files(root: Path) -> dict[str, bytes]:
    return {
        str(path.relative_to(root)): path.read_bytes()
        for path in sorted(root.rglob("*"))
        if path.is_file()
    }


def assert_refused(code: int, err: str, *phrases: str) -> None:
    assert code == 2, err
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert err.startswith("sluice: refused: demo-data "), err
    for phrase in phrases:
        assert phrase in err, err


def test_a_real_users_table_is_refused_and_left_as_it_was(demo: Demo, engine: sa.Engine) -> None:
    with engine.begin() as conn:
        conn.execute(sa.text("CREATE TABLE public.users (id bigint PRIMARY KEY, name text)"))
        conn.execute(sa.text("INSERT INTO public.users VALUES (1, 'ada'), (2, 'alan'), (7, 'g')"))
    before = database(engine)

    for command in ("demo-data", "demo"):  # (`demo` = demo-data, discover and run)
        code, err = demo("clickstream", command)

        assert_refused(code, err, "public.users", "3 rows", "not created by sluice demo-data")
        assert database(engine) == before
        assert not (demo.data / "landing").exists()  # no file written either
        assert not (demo.data / "warehouse").exists()


def test_a_table_of_the_same_name_it_did_not_create_is_refused(
    demo: Demo, engine: sa.Engine
) -> None:
    """Same columns as the demo's ``ref.fx_rates``, a comment of its own: not ours. The
    ``crm.customers`` the command would have created first is rolled back with it."""
    with engine.begin() as conn:
        conn.execute(sa.text("CREATE SCHEMA ref"))
        conn.execute(
            sa.text("CREATE TABLE ref.fx_rates (code text PRIMARY KEY, rate_to_eur numeric(12,6))")
        )
        conn.execute(sa.text("COMMENT ON TABLE ref.fx_rates IS 'rates from treasury'"))
        conn.execute(sa.text("INSERT INTO ref.fx_rates VALUES ('EUR', 1), ('USD', 0.5)"))
    before = database(engine)
    assert "crm" not in before["schemas"]

    code, err = demo("orders")

    assert_refused(code, err, "ref.fx_rates", "2 rows")
    assert database(engine) == before  # USD still 0.5, no crm schema, no crm.customers
    assert not (demo.data / "landing").exists()


def test_a_landing_folder_with_other_files_is_refused_and_left_as_it_was(
    demo: Demo, engine: sa.Engine
) -> None:
    landing = demo.data / "landing" / "events"
    (landing / "dt=2026-01-01").mkdir(parents=True)
    (landing / "dt=2026-01-01" / "part-00000.jsonl").write_bytes(b'{"event_id": "real"}\n')
    (landing / "notes.txt").write_text("delivered by the CRM export\n")
    before_files, before_db = files(demo.data), database(engine)

    code, err = demo("clickstream")

    assert_refused(code, err, str(landing), "2 file(s)", "dt=2026-01-01/part-00000.jsonl")
    assert files(demo.data) == before_files
    assert database(engine) == before_db  # public.users not created


def test_its_own_table_and_folder_are_refilled_and_a_foreign_file_stops_it(
    demo: Demo, engine: sa.Engine
) -> None:
    code, out = demo("clickstream")
    assert code == 0, out
    landing = demo.data / "landing" / "events"
    first = files(landing)
    listed = json.loads((landing / LANDING_MARKER).read_text())["files"]
    assert sorted(listed) == sorted(k for k in first if k != LANDING_MARKER)
    comment, rows = database(engine)["public.users"]
    assert comment.startswith(DEMO_COMMENT) and len(rows) == 40

    assert demo("clickstream")[0] == 0  # again: recognised, nothing to do
    assert files(landing) == first

    # Other sizes: its own table is refilled, more files go into its own folder.
    code, out = demo("clickstream", SLUICE_DEMO_USERS="60", SLUICE_DEMO_FILES_PER_DAY="3")
    assert code == 0, out
    assert len(database(engine)["public.users"][1]) == 60
    assert len([k for k in files(landing) if k.endswith(".jsonl")]) == 3

    # A file it did not write: refused, nothing changes.
    (landing / "dt=2026-01-02").mkdir()
    (landing / "dt=2026-01-02" / "late.jsonl").write_bytes(b"{}\n")
    before_files, before_db = files(demo.data), database(engine)
    code, err = demo("clickstream", SLUICE_DEMO_USERS="80")
    assert_refused(code, err, "dt=2026-01-02/late.jsonl")
    assert files(demo.data) == before_files
    assert database(engine) == before_db


def test_the_orders_example_reruns_on_its_own_objects(demo: Demo, engine: sa.Engine) -> None:
    assert demo("orders")[0] == 0
    tables = database(engine)
    assert all(tables[t][0].startswith(DEMO_COMMENT) for t in ("crm.customers", "ref.fx_rates"))
    code, out = demo("orders", SLUICE_DEMO_USERS="50", SLUICE_DEMO_SEED="8")
    assert code == 0, out
    assert len(database(engine)["crm.customers"][1]) == 50


def test_a_symlink_in_the_landing_folder_is_refused_and_not_written_through(
    demo: Demo, engine: sa.Engine, tmp_path: Path
) -> None:
    """A ``dt=`` folder linked to a real folder elsewhere: the generator would write its
    files through the link."""
    real = tmp_path / "real_day"
    real.mkdir()
    (real / "orders.jsonl").write_bytes(b'{"real": true}\n')
    landing = demo.data / "landing" / "events"
    landing.mkdir(parents=True)
    (landing / "dt=2026-01-01").symlink_to(real, target_is_directory=True)
    before_real, before_db = files(real), database(engine)

    code, err = demo("clickstream")

    assert_refused(code, err, "dt=2026-01-01")
    assert files(real) == before_real
    assert sorted(p.name for p in landing.iterdir()) == ["dt=2026-01-01"]
    assert database(engine) == before_db
