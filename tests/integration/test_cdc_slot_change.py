"""A CDC pipeline whose ``slot=`` changed after its snapshot (real Postgres): the new slot
would start elsewhere in the WAL, so discovery and a run refuse it in one line naming
``PostgresCdcSource(slot)``, creating nothing; ``cdc drop`` drops the slot the snapshot was
taken with as well, so no slot is left to fill the disk."""

from __future__ import annotations

import secrets
from typing import Any

import pytest
import sqlalchemy as sa
from cdc_oracle import create_table
from conftest import TestSettings

from enumerator_service import ConfigError
from enumerator_service._operations import discover, open_platform
from spark_jobs import Pipeline, PostgresCdcSource, PostgresSink
from spark_jobs.connectors.postgres_cdc import drop_slot, slot_info
from spark_jobs.connectors.postgres_cdc._slot import release_source
from spark_jobs.jobs import run_pipeline
from spark_jobs.pipeline._paths import discovery_of


def _pipeline(name: str, table: str, slot: str | None = None) -> Pipeline:
    return Pipeline(
        name=name,
        source=PostgresCdcSource(
            tables=table, key="id", schema={"id": "int64", "v": "string", "n": "int64"}, slot=slot
        ),
        sink=PostgresSink(f"{table}_out", upsert_key=["id"]),
    )


def test_a_changed_slot_name_is_refused_and_cdc_drop_drops_the_old_slot(
    make_settings: Any,
) -> None:
    settings: TestSettings = make_settings()
    platform = open_platform(settings)
    name, table = f"cdcmove_{secrets.token_hex(3)}", f"public.cdc_{secrets.token_hex(3)}"
    first = _pipeline(name, table)
    old = first.plan.source.options.slot
    new = f"{old}_b"
    moved = _pipeline(name, table, slot=new)
    options = moved.plan.source.options

    def refused(error: BaseException) -> None:
        line = str(error)
        assert "\n" not in line and "PostgresCdcSource(slot)" in line, line
        assert f"reads replication slot '{old}'" in line and f"not '{new}'" in line, line

    try:
        create_table(platform.engine, table, rows=10)
        assert discover(platform, discovery_of(first, settings)).splits_registered == 1
        with pytest.raises(ConfigError) as err:
            discover(platform, discovery_of(moved, settings))
        refused(err.value)
        with pytest.raises(ConfigError) as err:
            run_pipeline(settings, moved)
        refused(err.value)
        with platform.engine.connect() as conn:
            assert slot_info(conn, new) is None  # nothing created for the new name
            assert slot_info(conn, old) is not None
        lines = release_source(
            platform.engine, name, new, options.publication, list(options.tables)
        )
        assert f"replication slot {old} (named before): dropped" in lines, lines
        with platform.engine.connect() as conn:
            assert slot_info(conn, old) is None
            forgotten = sa.text("SELECT count(*) FROM sluice.enumerator_state WHERE source = :s")
            assert conn.execute(forgotten, {"s": name}).scalar_one() == 0
        # A new snapshot under the new name is accepted.
        assert discover(platform, discovery_of(moved, settings)).splits_registered == 1
        with platform.engine.connect() as conn:
            assert slot_info(conn, new) is not None
    finally:
        drop_slot(platform.engine, old, None)
        drop_slot(platform.engine, new, options.publication)
        platform.close()
