"""Discovery of a CDC source checks the definition the way a run does, before it creates
anything: a table that does not exist, a table without a primary key, a declared column the
table lacks, a declared type the column does not have — each one line naming the setting
(exit code 2 from ``sluice discover``), and no publication nor replication slot (holding
WAL) is left behind."""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from conftest import TestSettings

from enumerator_service import ConfigError
from enumerator_service._operations import discover, open_platform
from spark_jobs import Pipeline, PipelineDefinitionError, PostgresCdcSource, PostgresSink
from spark_jobs.connectors.postgres_cdc import drop_slot
from spark_jobs.pipeline._paths import discovery_of

SLUICE = str(Path(sys.executable).with_name("sluice"))

MODULE = """
from spark_jobs import Pipeline, PostgresCdcSource, PostgresSink

changes = Pipeline(
    name="{name}",
    source=PostgresCdcSource(tables=["{table}"], key="id",
                             schema={{"id": "int64", "v": "string"}}),
    sink=PostgresSink("{table}_out", upsert_key=["id"]),
)
"""


def _pipeline(name: str, table: str, schema: dict[str, str]) -> Pipeline:
    return Pipeline(
        name=name,
        source=PostgresCdcSource(tables=[table], key="id", schema=schema),
        sink=PostgresSink(f"{table}_out", upsert_key=["id"]),
    )


def _leftovers(engine: sa.Engine, name: str) -> tuple[int, int]:
    """(replication slots, publications) named after the pipeline (the defaults)."""
    with engine.connect() as conn:
        slots = conn.execute(
            sa.text("SELECT count(*) FROM pg_replication_slots WHERE slot_name = :n"),
            {"n": f"sluice_{name}"},
        ).scalar_one()
        publications = conn.execute(
            sa.text("SELECT count(*) FROM pg_publication WHERE pubname = :n"),
            {"n": f"sluice_{name}"},
        ).scalar_one()
    return int(slots), int(publications)


def test_sluice_discover_of_a_missing_table_is_one_line_naming_the_setting(
    db_url: str, tmp_path: Path
) -> None:
    name = f"cdcdef_{secrets.token_hex(3)}"
    table = f"public.missing_{secrets.token_hex(3)}"
    (tmp_path / "cdc_pipelines.py").write_text(MODULE.format(name=name, table=table))
    clean = {k: v for k, v in os.environ.items() if not k.startswith("SLUICE_")}
    env = {**clean, "SLUICE_PIPELINES": "cdc_pipelines", "SLUICE_DATABASE_URL": db_url}
    shown = subprocess.run(
        [SLUICE, "discover", name], env=env, cwd=tmp_path, capture_output=True, text=True
    )
    assert shown.returncode == 2, shown.stderr
    lines = shown.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in shown.stderr, shown.stderr
    assert f"PostgresCdcSource(tables): table {table} does not exist" in lines[0]
    engine = sa.create_engine(db_url)
    try:
        assert _leftovers(engine, name) == (0, 0)
    finally:
        engine.dispose()


@pytest.mark.parametrize(
    ("create", "schema", "expected"),
    [
        ("id bigint, v text", {"id": "int64", "v": "string"}, "no primary key"),
        ("id bigint PRIMARY KEY, v text", {"id": "int64", "w": "string"}, "has no column 'w'"),
        ("id bigint PRIMARY KEY, v int", {"id": "int64", "v": "string"}, "is declared string"),
        (
            "id bigint PRIMARY KEY, v text",
            {"id": "int32", "v": "string"},
            r"'id' is declared int32, narrower than .*\(bigint\): declare int64",
        ),
        (
            "id bigint PRIMARY KEY, v double precision",
            {"id": "int64", "v": "float32"},
            r"'v' is declared float32, narrower than .*: declare float64",
        ),
        (
            "id bigint PRIMARY KEY, v numeric(9,6)",
            {"id": "int64", "v": "decimal(9,4)"},
            r"'v' is declared decimal\(9,4\), narrower than .*\(numeric\(9,6\)\)",
        ),
    ],
    ids=[
        "no-primary-key",
        "wrong-column",
        "wrong-type",
        "narrower-key",
        "narrower-float",
        "narrower-decimal",
    ],
)
def test_discovery_of_a_definition_that_cannot_run_creates_nothing(
    make_settings: Any, create: str, schema: dict[str, str], expected: str
) -> None:
    settings: TestSettings = make_settings()
    platform = open_platform(settings)
    table = f"public.cdcdef_{secrets.token_hex(3)}"
    name = f"cdcdef_{secrets.token_hex(3)}"
    pipeline = _pipeline(name, table, schema)
    try:
        with platform.engine.begin() as conn:
            conn.execute(sa.text(f"CREATE TABLE {table} ({create})"))
            conn.execute(sa.text(f"INSERT INTO {table} (id) VALUES (1), (2)"))
        with pytest.raises(PipelineDefinitionError, match=expected) as err:
            discover(platform, discovery_of(pipeline, settings))
        assert "\n" not in str(err.value)
        assert _leftovers(platform.engine, name) == (0, 0)
    finally:
        drop_slot(platform.engine, f"sluice_{name}", f"sluice_{name}")
        platform.close()


def test_discovery_refuses_an_existing_sink_table_without_the_upsert_keys_index(
    make_settings: Any,
) -> None:
    """The sink table is there (made by hand) without a unique index on the upsert key: one
    line naming the sink at discovery — before a slot holds WAL for a run that would refuse
    it. With the index, discovery goes on."""
    settings: TestSettings = make_settings()
    platform = open_platform(settings)
    table = f"public.cdcdef_{secrets.token_hex(3)}"
    name = f"cdcdef_{secrets.token_hex(3)}"
    pipeline = _pipeline(name, table, {"id": "int64", "v": "string"})
    try:
        with platform.engine.begin() as conn:
            conn.execute(sa.text(f"CREATE TABLE {table} (id bigint PRIMARY KEY, v text)"))
            conn.execute(sa.text(f"CREATE TABLE {table}_out (id bigint, v text)"))
        with pytest.raises(ConfigError, match=r"^sink public\.cdcdef_\w+_out: .*no unique index"):
            discover(platform, discovery_of(pipeline, settings))
        assert _leftovers(platform.engine, name) == (0, 0)
        with platform.engine.begin() as conn:
            conn.execute(sa.text(f"ALTER TABLE {table}_out ADD PRIMARY KEY (id)"))
        discover(platform, discovery_of(pipeline, settings))  # (an empty table: no chunk)
        assert _leftovers(platform.engine, name) == (1, 1)
    finally:
        drop_slot(platform.engine, f"sluice_{name}", f"sluice_{name}")
        platform.close()
