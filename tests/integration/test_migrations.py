"""The Alembic migrations in sql/ produce exactly the SQLAlchemy metadata."""

from __future__ import annotations

import secrets
from collections.abc import Iterator

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy.engine import make_url

from enumerator_service import connect_engine, upgrade_schema
from enumerator_service._database import alembic_config
from enumerator_service._schema import SCHEMA, metadata


@pytest.fixture
def empty_engine(server_url: str) -> Iterator[sa.Engine]:
    name = f"sluice_mig_{secrets.token_hex(4)}"
    admin = sa.create_engine(
        make_url(server_url).set(drivername="postgresql+psycopg"), isolation_level="AUTOCOMMIT"
    )
    with admin.connect() as conn:
        conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
    engine = connect_engine(make_url(server_url).set(database=name).render_as_string(False))
    yield engine
    engine.dispose()
    with admin.connect() as conn:
        conn.execute(sa.text(f'DROP DATABASE "{name}" WITH (FORCE)'))
    admin.dispose()


def _diff(engine: sa.Engine) -> list[object]:
    with engine.connect() as conn:
        context = MigrationContext.configure(
            conn,
            opts={
                "include_schemas": True,
                "include_name": lambda name, type_, _p: type_ != "schema" or name == SCHEMA,
                "version_table_schema": SCHEMA,
                "compare_type": True,
                "compare_server_default": True,
            },
        )
        return list(compare_metadata(context, metadata))


def test_migrations_produce_exactly_the_metadata(empty_engine: sa.Engine) -> None:
    upgrade_schema(empty_engine)
    assert _diff(empty_engine) == []
    tables = set(sa.inspect(empty_engine).get_table_names(schema=SCHEMA))
    assert tables == {t.name for t in metadata.tables.values()} | {"alembic_version"}


def test_empty_database_differs_from_metadata(empty_engine: sa.Engine) -> None:
    # Guards the check above: an unmigrated database must show differences.
    with empty_engine.begin() as conn:
        conn.execute(sa.text(f"CREATE SCHEMA IF NOT EXISTS {SCHEMA}"))
    assert len(_diff(empty_engine)) >= len(metadata.tables)


def test_upgrade_is_idempotent(empty_engine: sa.Engine) -> None:
    upgrade_schema(empty_engine)
    upgrade_schema(empty_engine)
    with empty_engine.connect() as conn:
        version = conn.execute(
            sa.text(f"SELECT version_num FROM {SCHEMA}.alembic_version")
        ).scalar()
    head = ScriptDirectory.from_config(alembic_config(empty_engine)).get_current_head()
    assert version == head == "0012"


def test_partition_completeness_migrates_down_and_up_again(empty_engine: sa.Engine) -> None:
    from alembic import command

    upgrade_schema(empty_engine)
    event_time_tables = {"partition_completions", "partition_stats", "run_watermarks"}
    command.downgrade(alembic_config(empty_engine), "0007")
    inspector = sa.inspect(empty_engine)
    assert not event_time_tables & set(inspector.get_table_names(schema=SCHEMA))
    columns = {c["name"] for c in inspector.get_columns("sink_transactions", schema=SCHEMA)}
    assert "partition_counts" not in columns
    upgrade_schema(empty_engine)
    assert _diff(empty_engine) == []


def test_dead_letter_ordinals_migrate_down_and_up_again(empty_engine: sa.Engine) -> None:
    from alembic import command

    upgrade_schema(empty_engine)
    command.downgrade(alembic_config(empty_engine), "0011")
    inspector = sa.inspect(empty_engine)
    columns = {c["name"] for c in inspector.get_columns("dead_letters", schema=SCHEMA)}
    assert "ordinal" not in columns
    unique = inspector.get_unique_constraints("dead_letters", schema=SCHEMA)
    assert [u["column_names"] for u in unique] == [["split_id", "offset"]]
    upgrade_schema(empty_engine)
    assert _diff(empty_engine) == []
