"""Bad input of a CDC source on real Spark: a column added to the table is ignored (the
declared ones keep flowing), a declared column dropped is one line naming table and column,
a TRUNCATE and a slot dropped by an admin fail the run with one line — never "no
changes"."""

from __future__ import annotations

import secrets
from typing import Any

import pytest
import sqlalchemy as sa
from cdc_oracle import cdc_pipeline, compare, create_table, rows_of
from conftest import TestSettings
from rich.console import Console
from sqlalchemy.engine import make_url

from enumerator_service import ConfigError
from enumerator_service._checkpoint_commit import encode_dead_letters, insert_dead_letters
from enumerator_service._operations import discover, open_platform, platform_status
from enumerator_service._schema import dead_letters
from spark_jobs import (
    BadInputFailure,
    Pipeline,
    PipelineDefinitionError,
    PostgresCdcSource,
    PostgresSink,
)
from spark_jobs.cli._render import status_table
from spark_jobs.connectors import source_connector_named
from spark_jobs.connectors.postgres_cdc import SlotMissingError, drop_slot
from spark_jobs.connectors.postgres_cdc._publication import ensure_publication
from spark_jobs.connectors.postgres_cdc._slot import lsn_text
from spark_jobs.jobs import run_pipeline
from spark_jobs.pipeline._paths import discovery_of

pytestmark = pytest.mark.spark


def _snapshot(settings: TestSettings, platform: Any, rows: int) -> tuple[str, Any]:
    """A table of ``rows`` rows, its pipeline, the snapshot run, the stream split."""
    table = f"public.cdc_{secrets.token_hex(3)}"
    pipeline = cdc_pipeline(f"cdcbad_{secrets.token_hex(3)}", table)
    create_table(platform.engine, table, rows=rows)
    discover(platform, discovery_of(pipeline, settings))
    assert run_pipeline(settings, pipeline).rows_out == rows
    # sluice status counts the committed rows of the unpartitioned output (it showed 0).
    assert platform_status(platform, pipeline.name).rows_committed == rows
    return table, pipeline


def test_an_added_column_is_ignored_and_a_dropped_one_is_one_line(make_settings: Any) -> None:
    settings: TestSettings = make_settings(parallelism=1, checkpoint_interval_seconds=0.5)
    platform = open_platform(settings)
    table, pipeline = _snapshot(settings, platform, 20)
    options = pipeline.plan.source.options
    try:
        with platform.engine.begin() as conn:
            conn.execute(sa.text(f"ALTER TABLE {table} ADD COLUMN extra text"))
            conn.execute(sa.text(f"INSERT INTO {table} VALUES (21, 'new', 21, 'more')"))
            conn.execute(sa.text(f"UPDATE {table} SET v = 'changed', extra = 'e' WHERE id <= 5"))
            conn.execute(sa.text(f"DELETE FROM {table} WHERE id = 6"))
        assert discover(platform, discovery_of(pipeline, settings)).splits_registered == 1
        run_pipeline(settings, pipeline)
        diff = compare(rows_of(platform.engine, table), rows_of(platform.engine, f"{table}_out"))
        assert diff.equal, str(diff)
        with platform.engine.connect() as conn:
            updates = conn.execute(
                sa.text(f"SELECT _op, _before FROM {table}_out WHERE id <= 5")
            ).all()
        # Default replica identity: an update carries no old row.
        assert updates == [("u", None)] * 5
        with platform.engine.begin() as conn:
            conn.execute(sa.text(f"ALTER TABLE {table} DROP COLUMN n"))
        with pytest.raises(PipelineDefinitionError, match=f"table {table} has no column 'n'"):
            run_pipeline(settings, pipeline)
    finally:
        drop_slot(platform.engine, options.slot, options.publication)
        platform.close()


def test_a_truncate_fails_the_run_with_one_line(make_settings: Any) -> None:
    settings: TestSettings = make_settings(parallelism=1, checkpoint_interval_seconds=0.5)
    platform = open_platform(settings)
    table, pipeline = _snapshot(settings, platform, 10)
    options = pipeline.plan.source.options
    try:
        with platform.engine.begin() as conn:
            conn.execute(sa.text(f"TRUNCATE {table}"))
        discover(platform, discovery_of(pipeline, settings))
        with pytest.raises(BadInputFailure, match=f"table {table} was truncated") as err:
            run_pipeline(settings, pipeline)
        line = str(err.value)
        # Bad input, not a refused query nor the pipeline's code: its own form (exit 2).
        assert "\n" not in line and f"pipeline {pipeline.name}: bad input: table" in line
        assert "refused" not in line and "CdcError" not in line
    finally:
        drop_slot(platform.engine, options.slot, options.publication)
        platform.close()


def test_a_slot_dropped_by_an_admin_fails_with_one_line(make_settings: Any) -> None:
    settings: TestSettings = make_settings(parallelism=1, checkpoint_interval_seconds=0.5)
    platform = open_platform(settings)
    table, pipeline = _snapshot(settings, platform, 10)
    options = pipeline.plan.source.options
    try:
        assert discover(platform, discovery_of(pipeline, settings)).splits_registered == 1
        with platform.engine.begin() as conn:
            conn.execute(sa.text(f"INSERT INTO {table} VALUES (11, 'x', 11)"))
            conn.execute(sa.text("SELECT pg_drop_replication_slot(:s)"), {"s": options.slot})
        # (Found at the run's start now: the stream split is never handed to a reader.)
        with pytest.raises(
            BadInputFailure, match=f"replication slot '{options.slot}' (of \\S+ )?does not exist"
        ) as err:
            run_pipeline(settings, pipeline)
        assert "sluice cdc drop" in str(err.value) and "\n" not in str(err.value)
        assert "refused" not in str(err.value)
        with pytest.raises(SlotMissingError, match="does not exist"):
            discover(platform, discovery_of(pipeline, settings))
    finally:
        drop_slot(platform.engine, options.slot, options.publication)
        platform.close()


def test_a_run_after_the_slot_was_dropped_is_not_nothing_new(make_settings: Any) -> None:
    """The stream has committed past the slot's start, its split completed; then an admin
    drops the slot. A bounded run has no split to read — it must not end as "nothing new"
    but fail in one line naming the last committed position (not the slot's start)."""
    settings: TestSettings = make_settings(parallelism=1, checkpoint_interval_seconds=0.5)
    platform = open_platform(settings)
    table, pipeline = _snapshot(settings, platform, 10)
    options = pipeline.plan.source.options
    try:
        assert discover(platform, discovery_of(pipeline, settings)).splits_registered == 1
        with platform.engine.begin() as conn:
            conn.execute(sa.text(f"UPDATE {table} SET v = 'changed' WHERE id <= 5"))
        run_pipeline(settings, pipeline)
        diff = compare(rows_of(platform.engine, table), rows_of(platform.engine, f"{table}_out"))
        assert diff.equal, str(diff)
        with platform.engine.begin() as conn:
            start = conn.execute(
                sa.text(
                    "SELECT cursor ->> 'start_lsn' FROM sluice.enumerator_state WHERE source = :s"
                ),
                {"s": pipeline.name},
            ).scalar_one()
            committed = conn.execute(
                sa.text(
                    "SELECT committed_offset FROM sluice.splits WHERE source = :s"
                    " AND kind = 'pgcdc' AND status = 'COMPLETED'"
                ),
                {"s": pipeline.name},
            ).scalar_one()
            assert committed > int(start)
            conn.execute(sa.text(f"UPDATE {table} SET v = 'lost' WHERE id = 1"))
            conn.execute(sa.text("SELECT pg_drop_replication_slot(:s)"), {"s": options.slot})
        with pytest.raises(BadInputFailure, match="does not exist") as err:
            run_pipeline(settings, pipeline)
        line = str(err.value)
        assert "\n" not in line and f"sluice cdc drop {pipeline.name}" in line
        assert f"pipeline {pipeline.name}: bad input: replication slot" in line
        assert f"LSN {lsn_text(committed)}" in line and lsn_text(int(start)) not in line
        connector = source_connector_named(pipeline.plan.source.kind)
        with platform.engine.connect() as conn:  # ``sluice status`` says it was dropped
            held = connector.source_status(conn, pipeline.plan)
        assert held == {"slot": options.slot, "slot_exists": False, "slot_dropped": True}
        table_view = status_table(platform_status(platform, pipeline.name), held)
        console = Console(record=True, width=250)
        console.print(table_view)
        assert f"{options.slot} DROPPED under the pipeline" in console.export_text()
    finally:
        drop_slot(platform.engine, options.slot, options.publication)
        platform.close()


def test_a_user_who_cannot_create_the_publication_gets_one_line(db_url: str) -> None:
    """The owner of the tables without CREATE on the database (Postgres 15+ grants it to
    nobody by default): a ConfigError saying what to grant or to do, not a SQL traceback."""
    role, schema = f"nocreate_{secrets.token_hex(3)}", f"shop_{secrets.token_hex(3)}"
    admin = sa.create_engine(make_url(db_url).set(drivername="postgresql+psycopg"))
    with admin.begin() as conn:
        conn.execute(sa.text(f"CREATE ROLE {role} LOGIN REPLICATION"))
        conn.execute(sa.text(f"CREATE SCHEMA {schema} AUTHORIZATION {role}"))
    as_owner = sa.create_engine(
        make_url(db_url).set(drivername="postgresql+psycopg", username=role, password=None)
    )
    try:
        with as_owner.begin() as conn:
            conn.execute(sa.text(f"CREATE TABLE {schema}.orders (id bigint PRIMARY KEY)"))
        with as_owner.begin() as conn, pytest.raises(ConfigError) as raised:
            ensure_publication(conn, f"{schema}_pub", [(schema, "orders")])
        message = str(raised.value)
        assert message.startswith("PostgresCdcSource(publication): cannot create publication"), (
            message
        )
        assert "CREATE on the database" in message and "\n" not in message
    finally:
        as_owner.dispose()
        with admin.begin() as conn:
            conn.execute(sa.text(f"DROP SCHEMA {schema} CASCADE"))
            conn.execute(sa.text(f"DROP ROLE {role}"))
        admin.dispose()


def test_every_bad_change_of_one_transaction_is_a_dead_letter(make_settings: Any) -> None:
    # The changes of one transaction share its commit LSN as their offset: each bad one is
    # its own dead letter (the trial found all but one dropped, the run counting 3 of 4 in).
    settings: TestSettings = make_settings(parallelism=1, checkpoint_interval_seconds=0.5)
    platform = open_platform(settings)
    table = f"public.cdcnan_{secrets.token_hex(3)}"
    pipeline = Pipeline(
        name=f"cdcnan_{secrets.token_hex(3)}",
        source=PostgresCdcSource(tables=[table], key="id", schema={"id": "int64", "f": "float64"}),
        sink=PostgresSink(f"{table}_out", upsert_key=["id"]),
    )
    options = pipeline.plan.source.options
    with platform.engine.begin() as conn:
        conn.execute(sa.text(f"CREATE TABLE {table} (id bigint PRIMARY KEY, f float8)"))
        conn.execute(sa.text(f"INSERT INTO {table} SELECT g, g FROM generate_series(1, 5) g"))
    try:
        discover(platform, discovery_of(pipeline, settings))
        assert run_pipeline(settings, pipeline).rows_out == 5
        with platform.engine.begin() as conn:
            conn.execute(sa.text(f"UPDATE {table} SET f = 'NaN' WHERE id IN (1, 2)"))
            conn.execute(sa.text(f"UPDATE {table} SET f = 42.5 WHERE id = 3"))
            conn.execute(sa.text(f"UPDATE {table} SET f = '-Infinity' WHERE id = 4"))
        discover(platform, discovery_of(pipeline, settings))
        summary = run_pipeline(settings, pipeline)
        assert (summary.rows_in, summary.rows_out, summary.dead_letters) == (4, 1, 3)
        with platform.engine.connect() as conn:
            letters = conn.execute(
                sa.select(
                    dead_letters.c.offset,
                    dead_letters.c.ordinal,
                    dead_letters.c.raw,
                    dead_letters.c.split_id,
                )
                .where(dead_letters.c.source == pipeline.name)
                .order_by(dead_letters.c.ordinal)
            ).all()
        assert [o for _, o, _, _ in letters] == [0, 1, 2]
        assert len({offset for offset, _, _, _ in letters}) == 1  # the commit's LSN
        raws = [bytes(raw) for _, _, raw, _ in letters]
        assert [b'"id":1' in raws[0], b'"id":2' in raws[1], b'"id":4' in raws[2]] == [True] * 3
        assert b'"f":"nan"' in raws[0] and b'"f":"-inf"' in raws[2]  # the value itself
        # A replay of the block (a crash after it was acknowledged) keeps them once.
        again = [(split, offset, raw, "again") for offset, _, raw, split in letters]
        with platform.engine.begin() as conn:
            insert_dead_letters(conn, "replay", encode_dead_letters(again))
        with platform.engine.connect() as conn:
            count = sa.select(sa.func.count()).where(dead_letters.c.source == pipeline.name)
            assert conn.execute(count).scalar_one() == 3
    finally:
        drop_slot(platform.engine, options.slot, options.publication)
        platform.close()
