"""The sluice CLI: configuration and definition errors fail fast with one line and exit 2,
commands work on a real database for the pipelines of a user's module."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import date
from pathlib import Path
from typing import Any

import pytest

SLUICE = str(Path(sys.executable).with_name("sluice"))

#: A user's module, written into the working directory of the command.
MODULE = """
from spark_jobs import FileSource, Lookup, Pipeline, PostgresSink

events = Pipeline(
    name="cli_events",
    source=FileSource(landing="{landing}", schema={{"x": "int64", "name": "string"}}),
)
orders = Pipeline(
    name="cli_orders",
    source=FileSource(
        schema={{"order_id": "string", "tenant": "int64", "customer": "string"}},
        partition_by=None,
    ),
    steps=[Lookup("public.cli_customers", on={{"tenant": "tenant", "customer": "id"}},
                  columns={{"name": "customer_name"}})],
    sink=PostgresSink("public.cli_orders", upsert_key=["order_id"]),
)
"""


def _run(args: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("SLUICE_") and k != "COLUMNS"}
    return subprocess.run(
        [SLUICE, *args], env={**clean, **env}, cwd=cwd, capture_output=True, text=True, timeout=120
    )


def _module(tmp_path: Path, landing: Path, source: str = MODULE) -> dict[str, str]:
    (tmp_path / "cli_pipelines.py").write_text(source.format(landing=landing))
    return {"SLUICE_PIPELINES": "cli_pipelines"}


@pytest.mark.parametrize(
    ("env", "setting"),
    [
        ({"SLUICE_DATABASE_URL": "mysql://x@y/z"}, "SLUICE_DATABASE_URL"),
        ({"SLUICE_PIPELINES": "my pipelines"}, "SLUICE_PIPELINES"),
        ({"SLUICE_PIPELINES": "no_such_module_here"}, "SLUICE_PIPELINES"),
        ({"SLUICE_PARALLELISM": "0"}, "SLUICE_PARALLELISM"),
        ({"SLUICE_DISCOVERY_MAX_FILES_PER_TICK": "0"}, "SLUICE_DISCOVERY_MAX_FILES_PER_TICK"),
        (
            {"SLUICE_DISCOVERY_MAX_FILES_PER_TICK": "many"},
            "SLUICE_DISCOVERY_MAX_FILES_PER_TICK",
        ),
    ],
)
def test_bad_configuration_is_one_line_and_exit_2(
    env: dict[str, str], setting: str, tmp_path: Path
) -> None:
    result = _run(["status"], env, tmp_path)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and setting in lines[0], result.stderr
    assert "Traceback" not in result.stderr
    assert "hunter2" not in result.stderr + result.stdout


def test_a_database_that_does_not_answer_is_an_outage_exit_1(tmp_path: Path) -> None:
    # Nothing listens on port 9: an outage (or a wrong address), which running again may
    # get past — exit 1, like a run that failed, not 2 (a scheduler's alert, not a retry).
    env = {"SLUICE_DATABASE_URL": "postgresql://sluice:hunter2@127.0.0.1:9/none"}
    result = _run(["status"], env, tmp_path)
    assert result.returncode == 1, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("sluice: unreachable: SLUICE_DATABASE_URL: cannot connect to")
    assert "hunter2" not in result.stderr + result.stdout


def test_a_database_that_refuses_the_user_is_a_configuration_error(
    db_url: str, tmp_path: Path
) -> None:
    from sqlalchemy.engine import make_url

    wrong = make_url(db_url).set(database="no_such_database_here")
    env = {"SLUICE_DATABASE_URL": wrong.render_as_string(hide_password=False)}
    result = _run(["status"], env, tmp_path)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("sluice: configuration error: SLUICE_"), lines
    assert "no_such_database_here" in lines[0] and "does not exist" in lines[0]


def test_a_definition_mistake_is_one_line_and_exit_2(tmp_path: Path) -> None:
    bad = MODULE.replace('on={{"tenant": "tenant"', 'on={{"tenant_id": "tenant"')
    env = _module(tmp_path, tmp_path / "landing", bad)
    result = _run(["pipelines"], env, tmp_path)
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stderr.strip() == (
        "sluice: definition error: pipeline cli_orders: step 1 (Lookup public.cli_customers): "
        "on: key field 'tenant_id' is not in the input (fields: order_id, tenant, customer)"
    )


def test_a_key_type_that_does_not_match_its_column_fails_when_the_run_opens(
    db_url: str, tmp_path: Path
) -> None:
    import sqlalchemy as sa

    engine = sa.create_engine(db_url.replace("postgresql://", "postgresql+psycopg://", 1))
    with engine.begin() as conn:
        conn.execute(
            sa.text(
                "CREATE TABLE IF NOT EXISTS public.cli_customers "
                "(tenant bigint, id bigint, name text, PRIMARY KEY (tenant, id))"
            )
        )
    engine.dispose()
    landing = tmp_path / "data" / "landing" / "cli_orders"
    landing.mkdir(parents=True)
    (landing / "o.csv").write_text("order_id,tenant,customer\no1,1,c9\n")
    env = {
        **_module(tmp_path, tmp_path / "landing"),
        "SLUICE_DATABASE_URL": db_url,
        "SLUICE_DATA_DIR": str(tmp_path / "data"),
    }
    assert _run(["discover", "cli_orders"], env, tmp_path).returncode == 0
    result = _run(["run", "cli_orders"], env, tmp_path)
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stderr.strip() == (
        "sluice: definition error: pipeline cli_orders: step 1 (Lookup public.cli_customers): "
        "key field 'customer' is string but public.cli_customers.id is bigint"
    )


def test_pipelines_lists_source_steps_sink_and_output(db_url: str, tmp_path: Path) -> None:
    # A lookup table not created yet is a note, not an error (another test creates
    # public.cli_customers with a key type that does not fit: an error, exit 2).
    source = MODULE.replace("public.cli_customers", "public.cli_customers_later")
    env = {**_module(tmp_path, tmp_path / "landing", source), "SLUICE_DATABASE_URL": db_url}
    result = _run(["pipelines"], env, tmp_path)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "not checked against the database yet" in out and "does not exist" in out
    # Piped (no terminal, no COLUMNS): lines are not wrapped at rich's 80 columns.
    assert (
        "not checked against the database yet: pipeline cli_orders: step 1 (Lookup"
        " public.cli_customers_later): table public.cli_customers_later does not exist" in out
    ), out
    for text in (
        "Pipeline cli_events",
        "Pipeline cli_orders",
        "Lookup public.cli_customers_later on tenant=tenant, customer=id",
        "postgres public.cli_orders, upsert on order_id",
        "customer_name",
    ):
        assert text in out, out


def test_pipelines_refuses_an_existing_sink_table_without_a_key_index(
    db_url: str, tmp_path: Path
) -> None:
    """The sink table is there, made by hand without a unique index on the upsert key: the
    listing says so (the run would refuse it), exit 2; the output fields are still shown."""
    import sqlalchemy as sa

    table = "cli_orders_noindex"
    source = MODULE.replace("public.cli_orders", f"public.{table}").replace(
        'steps=[Lookup("public.cli_customers", on={{"tenant": "tenant", "customer": "id"}},\n'
        '                  columns={{"name": "customer_name"}})],',
        "steps=[],",
    )
    assert "steps=[]," in source
    engine = sa.create_engine(db_url.replace("postgresql://", "postgresql+psycopg://", 1))
    try:
        with engine.begin() as conn:
            conn.execute(sa.text(f"CREATE TABLE public.{table} (order_id text, tenant bigint)"))
        env = {**_module(tmp_path, tmp_path / "landing", source), "SLUICE_DATABASE_URL": db_url}
        result = _run(["pipelines"], env, tmp_path)
        assert result.returncode == 2, result.stdout + result.stderr
        assert f"sink public.{table}: " in result.stdout and "unique index" in result.stdout
        assert "customer" in result.stdout  # (the plan is still listed)
        assert "1 pipeline definition error(s)" in result.stderr
    finally:
        with engine.begin() as conn:
            conn.execute(sa.text(f"DROP TABLE IF EXISTS public.{table}"))
        engine.dispose()


def test_missing_landing_folder_names_the_pipeline(db_url: str, tmp_path: Path) -> None:
    env = {**_module(tmp_path, tmp_path / "nope"), "SLUICE_DATABASE_URL": db_url}
    result = _run(["discover", "cli_events"], env, tmp_path)
    assert result.returncode == 2
    assert result.stderr.strip().startswith("sluice: configuration error: cli_events: landing")


def test_several_pipelines_need_a_name(db_url: str, tmp_path: Path) -> None:
    env = {**_module(tmp_path, tmp_path / "landing"), "SLUICE_DATABASE_URL": db_url}
    result = _run(["run"], env, tmp_path)
    assert result.returncode == 2
    assert "name one of the pipelines: cli_events, cli_orders" in result.stderr


def test_status_and_discover_on_a_real_database(db_url: str, tmp_path: Path) -> None:
    landing = tmp_path / "landing"
    (landing / "dt=2026-01-01").mkdir(parents=True)
    (landing / "dt=2026-01-01" / "part-0.jsonl").write_text('{"x": 1}\n')
    env = {**_module(tmp_path, landing), "SLUICE_DATABASE_URL": db_url}
    first = _run(["discover", "cli_events"], env, tmp_path)
    assert first.returncode == 0, first.stderr
    assert "1 new splits registered" in first.stdout
    second = _run(["discover", "cli_events"], env, tmp_path)
    assert "0 new splits registered" in second.stdout
    status = _run(["status", "cli_events"], env, tmp_path)
    assert status.returncode == 0, status.stderr
    assert "splits unassigned" in status.stdout
    as_json = _run(["status", "--json"], env, tmp_path)
    assert as_json.returncode == 0, as_json.stderr
    found: dict[str, Any] = json.loads(as_json.stdout)["pipelines"]
    assert found["cli_events"]["splits"]["UNASSIGNED"] == 1
    assert found["cli_orders"]["rows_committed"] == 0
    assert "postgresql" not in as_json.stdout


def test_replace_needs_the_partitions_to_replace(tmp_path: Path) -> None:
    result = _run(["run", "--replace"], {}, tmp_path)
    assert result.returncode == 2
    assert "--replace needs the partitions to replace (--date)" in result.stderr
    assert "Traceback" not in result.stderr


def test_version(tmp_path: Path) -> None:
    result = _run(["--version"], {}, tmp_path)
    assert result.returncode == 0 and result.stdout.startswith("sluice, version ")


def test_discover_drains_a_backlog_larger_than_the_per_tick_cap(
    db_url: str, tmp_path: Path
) -> None:
    landing = tmp_path / "landing"
    (landing / "dt=2026-01-01").mkdir(parents=True)
    for i in range(5):
        (landing / "dt=2026-01-01" / f"part-{i}.jsonl").write_text('{"x": 1}\n')
    env = {
        **_module(tmp_path, landing),
        "SLUICE_DATABASE_URL": db_url,
        "SLUICE_DISCOVERY_MAX_FILES_PER_TICK": "2",
    }
    first = _run(["discover", "cli_events"], env, tmp_path)
    assert first.returncode == 0, first.stderr
    assert "5 new splits registered in 3 ticks" in first.stdout
    second = _run(["discover", "cli_events"], env, tmp_path)
    assert "0 new splits registered" in second.stdout
    assert "ticks" not in second.stdout


def test_discover_skips_and_counts_links_out_of_the_landing_folder(
    db_url: str, tmp_path: Path
) -> None:
    landing = tmp_path / "landing"
    (landing / "dt=2026-01-01").mkdir(parents=True)
    (landing / "dt=2026-01-01" / "part-0.jsonl").write_text('{"x": 1}\n')
    (tmp_path / "secret.jsonl").write_text('{"x": 2}\n')
    (landing / "dt=2026-01-01" / "part-1.jsonl").symlink_to(tmp_path / "secret.jsonl")
    env = {**_module(tmp_path, landing), "SLUICE_DATABASE_URL": db_url}
    first = _run(["discover", "cli_events"], env, tmp_path)
    assert first.returncode == 0, first.stderr
    assert "1 new splits registered; 1 symbolic link(s) skipped" in " ".join(first.stdout.split())
    assert " ".join(first.stderr.split()).count("outside the landing folder") == 1
    bad = _run(["discover", "cli_events"], {**env, "SLUICE_FOLLOW_SYMLINKS": "maybe"}, tmp_path)
    assert bad.returncode == 2
    assert bad.stderr.strip().startswith("sluice: configuration error: SLUICE_FOLLOW_SYMLINKS:")
    follow = _run(["discover", "cli_events"], {**env, "SLUICE_FOLLOW_SYMLINKS": "true"}, tmp_path)
    assert follow.returncode == 0, follow.stderr
    assert "1 new splits registered" in follow.stdout and "skipped" not in follow.stdout


def test_replacing_a_day_fed_by_a_half_read_file_is_one_line_and_exit_2(
    db_url: str, tmp_path: Path
) -> None:
    """``--replace`` of a day that a file of another landing day fed, while that file is not
    read to the end (event-day partitions: re-read for the day, it would write only the
    day's rows), is refused before anything moves: one line, exit 2, no traceback."""
    import secrets

    import sqlalchemy as sa

    from enumerator_service._schema import SplitStatus, split_partitions, splits

    name = f"cli_events_{secrets.token_hex(3)}"  # splits and stats of its own
    landing = tmp_path / "landing"
    for day in ("2026-01-01", "2026-01-02"):
        (landing / f"dt={day}").mkdir(parents=True)
        (landing / f"dt={day}" / "part-0.jsonl").write_text('{"x": 1}\n')
    module = MODULE.replace('name="cli_events"', f'name="{name}"').replace(
        'schema={{"x": "int64", "name": "string"}}',
        'schema={{"x": "int64", "ts": "timestamp"}}, event_time="ts"',
    )
    env = {**_module(tmp_path, landing, module), "SLUICE_DATABASE_URL": db_url}
    assert _run(["discover", name], env, tmp_path).returncode == 0
    engine = sa.create_engine(db_url)
    try:
        with engine.begin() as conn:  # d1's file read; d2's fed d1, then its run died
            ids = dict(
                conn.execute(
                    sa.select(splits.c.partition_key, splits.c.id).where(splits.c.source == name)
                ).all()
            )
            d1, d2 = date(2026, 1, 1), date(2026, 1, 2)
            conn.execute(sa.update(splits).where(splits.c.id == ids[d1]).values(status="COMPLETED"))
            conn.execute(sa.update(splits).where(splits.c.id == ids[d2]).values(committed_offset=3))
            conn.execute(
                sa.insert(split_partitions).values(
                    [
                        {"split_id": ids[d1], "partition_key": d1},
                        {"split_id": ids[d2], "partition_key": d1},
                    ]
                )
            )
        result = _run(["run", name, "--date", "2026-01-01", "--replace"], env, tmp_path)
        assert result.returncode == 2, result.stdout + result.stderr
        assert "Traceback" not in result.stderr
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1, result.stderr
        assert lines[0].startswith(
            f"sluice: cannot replace: partition 2026-01-01 of {name!r}: file "
        ), result.stderr
        assert lines[0].endswith(
            "dt=2026-01-02/part-0.jsonl (landing day 2026-01-02, unassigned) is not read to "
            "the end and may hold rows of it: run the pipeline to read it first"
        ), result.stderr
        with engine.connect() as conn:  # nothing started, nothing reset
            statuses = conn.execute(
                sa.select(splits.c.status, splits.c.rebuild_id)
                .where(splits.c.source == name)
                .order_by(splits.c.partition_key)
            ).all()
        assert [tuple(row) for row in statuses] == [
            (SplitStatus.COMPLETED, None),
            (SplitStatus.UNASSIGNED, None),
        ]
    finally:
        engine.dispose()
