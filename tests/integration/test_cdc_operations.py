"""Operating a CDC source: ``sluice status`` shows the slot and the WAL it retains, the Dagster
check fails beyond SLUICE_CDC_MAX_RETAINED_WAL_MB, ``sluice cdc drop`` drops slot and
publication and the next discovery starts over with a new snapshot; bad input is one line
(a server without wal_level=logical, a table without a key or replica identity)."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from cdc_oracle import create_table
from conftest import TestSettings

from dagster_project._check_outcomes import check_names, outcomes_of
from enumerator_service import ConfigError
from enumerator_service._operations import discover, open_platform
from spark_jobs import Pipeline, PipelineDefinitionError, PostgresCdcSource, PostgresSink
from spark_jobs.connectors.postgres_cdc import PublicationMissingError, drop_slot, slot_info
from spark_jobs.connectors.postgres_cdc._slot import (
    check_wal_level,
    publication_tables,
    release_source,
)
from spark_jobs.jobs import run_pipeline
from spark_jobs.pipeline._paths import discovery_of

SLUICE = str(Path(sys.executable).with_name("sluice"))

MODULE = """
from spark_jobs import Pipeline, PostgresCdcSource, PostgresSink

changes = Pipeline(
    name="{name}",
    source=PostgresCdcSource(tables="{table}", key="id",
                             schema={{"id": "int64", "v": "string", "n": "int64"}}),
    sink=PostgresSink("{table}_out", upsert_key=["id"]),
)
"""


def _sluice(args: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("SLUICE_")}
    return subprocess.run(
        [SLUICE, *args], env={**clean, **env}, cwd=cwd, capture_output=True, text=True, timeout=120
    )


def _pipeline(name: str, table: str) -> Pipeline:
    return Pipeline(
        name=name,
        source=PostgresCdcSource(
            tables=table, key="id", schema={"id": "int64", "v": "string", "n": "int64"}
        ),
        sink=PostgresSink(f"{table}_out", upsert_key=["id"]),
    )


def test_status_check_and_drop_of_a_slot(make_settings: Any, db_url: str, tmp_path: Path) -> None:
    settings: TestSettings = make_settings()
    platform = open_platform(settings)
    table = f"public.cdc_{secrets.token_hex(3)}"
    name = f"cdcops_{secrets.token_hex(3)}"
    pipeline = _pipeline(name, table)
    slot = pipeline.plan.source.options.slot
    (tmp_path / "cdc_pipelines.py").write_text(MODULE.format(name=name, table=table))
    env = {"SLUICE_PIPELINES": "cdc_pipelines", "SLUICE_DATABASE_URL": db_url}
    try:
        create_table(platform.engine, table, rows=10)
        assert discover(platform, discovery_of(pipeline, settings)).splits_registered == 1
        with platform.engine.begin() as conn:  # WAL the idle slot now keeps
            conn.execute(
                sa.text(f"INSERT INTO {table} SELECT g, 'x', g FROM generate_series(11, 30000) g")
            )
        shown = _sluice(["status", name, "--json"], env, tmp_path)
        assert shown.returncode == 0, shown.stderr
        held = json.loads(shown.stdout)["pipelines"][name]["source"]
        assert held["slot"] == slot and held["slot_exists"] and not held["slot_active"]
        assert held["retained_wal_bytes"] > 1 << 20
        table_view = _sluice(["status", name], env, tmp_path)
        assert f"{slot} inactive, retains" in table_view.stdout
        # The Dagster check: within the default bound, beyond a bound of 1 MB.
        assert "source_health" in check_names(pipeline)
        ok = outcomes_of(pipeline, settings, "source_health", 0.1)([None])[None]
        assert ok.passed
        tight = make_settings(cdc_max_retained_wal_mb=1)
        failed = outcomes_of(pipeline, tight, "source_health", 0.1)([None])[None]
        assert not failed.passed
        assert (
            failed.description is not None
            and "SLUICE_CDC_MAX_RETAINED_WAL_MB=1" in failed.description
        )
        assert f"sluice cdc drop {name}" in failed.description
        # Drop: slot, publication, splits and cursor; the next discovery starts over.
        dropped = _sluice(["cdc", "drop", name, "--yes"], env, tmp_path)
        assert dropped.returncode == 0, dropped.stderr
        assert f"replication slot {slot}: dropped" in dropped.stdout
        with platform.engine.connect() as conn:
            assert slot_info(conn, slot) is None
            assert (
                conn.execute(
                    sa.text("SELECT count(*) FROM pg_publication WHERE pubname = :p"), {"p": slot}
                ).scalar_one()
                == 0
            )
        again = discover(platform, discovery_of(pipeline, settings))
        assert again.splits_registered == 1  # a new snapshot (30000 rows, one chunk)
        with platform.engine.connect() as conn:
            assert slot_info(conn, slot) is not None
    finally:
        drop_slot(platform.engine, slot, slot)
        platform.close()


def test_discover_after_a_slot_dropped_by_hand_is_one_line(
    make_settings: Any, db_url: str, tmp_path: Path
) -> None:
    """``sluice discover`` of a pipeline whose slot an admin dropped: the one line (no
    traceback) telling to drop and discover again, and the bad-input exit code 2."""
    settings: TestSettings = make_settings()
    platform = open_platform(settings)
    table = f"public.cdc_{secrets.token_hex(3)}"
    name = f"cdcops_{secrets.token_hex(3)}"
    pipeline = _pipeline(name, table)
    slot = pipeline.plan.source.options.slot
    (tmp_path / "cdc_pipelines.py").write_text(MODULE.format(name=name, table=table))
    env = {"SLUICE_PIPELINES": "cdc_pipelines", "SLUICE_DATABASE_URL": db_url}
    try:
        create_table(platform.engine, table, rows=10)
        assert discover(platform, discovery_of(pipeline, settings)).splits_registered == 1
        with platform.engine.begin() as conn:
            conn.execute(sa.text("SELECT pg_drop_replication_slot(:s)"), {"s": slot})
        shown = _sluice(["discover", name], env, tmp_path)
        assert shown.returncode == 2, shown.stderr
        lines = shown.stderr.strip().splitlines()
        assert len(lines) == 1 and "Traceback" not in shown.stderr, shown.stderr
        assert f"replication slot '{slot}' of {name} does not exist" in lines[0]
        assert f"sluice cdc drop {name}" in lines[0]
        discovered = lines[0]
        # A run says the same (never "nothing new", exit 0), before any split moves.
        ran = _sluice(["run", name], env, tmp_path)
        assert ran.returncode == 2, ran.stdout + ran.stderr
        lines = ran.stderr.strip().splitlines()
        assert len(lines) == 1 and "Traceback" not in ran.stderr, ran.stderr
        assert f"replication slot '{slot}' of {name} does not exist" in lines[0]
        # In the same words: "sluice: pipeline <name>: bad input: ...".
        assert lines[0] == discovered
        assert discovered.startswith(f"sluice: pipeline {name}: bad input: replication slot")
        assert "Nothing new" not in ran.stdout
    finally:
        drop_slot(platform.engine, slot, slot)
        platform.close()


def _published(platform: Any, publication: str) -> set[tuple[str, str]] | None:
    with platform.engine.connect() as conn:
        return publication_tables(conn, publication)


def test_another_pipelines_publication_is_neither_altered_nor_dropped(make_settings: Any) -> None:
    """A pipeline naming another's publication (other tables): its discovery is refused in
    one line naming PostgresCdcSource(publication) and alters nothing; its 'cdc drop' keeps
    that publication (and says so). The owner's stream, once started, does not recreate a
    publication dropped under it: one line, never a silent loss of changes."""
    settings: TestSettings = make_settings()
    platform = open_platform(settings)
    owner = _pipeline(f"cdcown_{secrets.token_hex(3)}", f"public.cdc_{secrets.token_hex(3)}")
    publication = owner.plan.source.options.publication
    theirs = f"public.cdc_{secrets.token_hex(3)}"
    intruder = Pipeline(
        name=f"cdcint_{secrets.token_hex(3)}",
        source=PostgresCdcSource(
            tables=theirs,
            key="id",
            schema={"id": "int64", "v": "string", "n": "int64"},
            publication=publication,
        ),
        sink=PostgresSink(f"{theirs}_out", upsert_key=["id"]),
    )
    mine = {("public", owner.plan.source.options.tables[0][1])}
    intruder_slot = intruder.plan.source.options.slot
    try:
        create_table(platform.engine, owner.plan.source.options.table_names[0], rows=10)
        create_table(platform.engine, theirs, rows=10)
        assert discover(platform, discovery_of(owner, settings)).splits_registered == 1
        assert _published(platform, publication) == mine
        # (a) refused in one line, nothing altered, no slot created.
        with pytest.raises(ConfigError, match=r"PostgresCdcSource\(publication\)") as err:
            discover(platform, discovery_of(intruder, settings))
        assert "\n" not in str(err.value) and "lists " in str(err.value)
        assert _published(platform, publication) == mine
        with platform.engine.connect() as conn:
            assert slot_info(conn, intruder_slot) is None
        # (b) its drop keeps the owner's publication, and says so.
        lines = release_source(
            platform.engine, intruder.name, intruder_slot, publication, [("public", theirs[7:])]
        )
        assert any(line.startswith(f"publication {publication}: not dropped") for line in lines)
        assert _published(platform, publication) == mine
        # (c) dropped under the owner's started stream: one line, not recreated.
        with platform.engine.begin() as conn:
            conn.execute(sa.text(f'DROP PUBLICATION "{publication}"'))
        with pytest.raises(PublicationMissingError, match="does not exist") as missing:
            discover(platform, discovery_of(owner, settings))
        assert f"sluice cdc drop {owner.name}" in str(missing.value)
        assert "\n" not in str(missing.value)
        assert _published(platform, publication) is None
    finally:
        drop_slot(platform.engine, owner.plan.source.options.slot, publication)
        drop_slot(platform.engine, intruder_slot, None)
        platform.close()


def test_a_stream_split_a_live_run_reads_is_not_backlog(make_settings: Any) -> None:
    """The stream split of a continuous run is READING as long as the run lives: not
    backlog. Once its lease has expired (the run died), it is waiting again."""
    from datetime import UTC, datetime, timedelta

    from enumerator_service._live_state import live_state

    settings: TestSettings = make_settings()
    platform = open_platform(settings)
    source = f"cdclive_{secrets.token_hex(3)}"
    now = datetime.now(UTC)
    later_lease = now + timedelta(days=60)
    insert = sa.text(
        "INSERT INTO sluice.splits (source, kind, uri, start_offset, end_offset, status,"
        " lease_expires_at) VALUES (:s, 'pgcdc', :u, 0, :e, :st, :lease)"
    )
    try:
        with platform.engine.begin() as conn:
            conn.execute(
                insert,
                {
                    "s": source,
                    "u": "slot",
                    "e": None,
                    "st": "READING",
                    "lease": later_lease,
                },
            )
            conn.execute(
                insert, {"s": source, "u": "chunk", "e": 10, "st": "UNASSIGNED", "lease": None}
            )
        with platform.engine.connect() as conn:
            assert live_state(conn, source, now).backlog_splits == 1  # the chunk only
            later = now + timedelta(days=61)  # the stream's lease expired: waiting
            assert live_state(conn, source, later).backlog_splits == 2
    finally:
        with platform.engine.begin() as conn:
            conn.execute(sa.text("DELETE FROM sluice.splits WHERE source = :s"), {"s": source})
        platform.close()


def test_a_stream_split_given_back_waits_from_then_a_file_from_its_registration(
    make_settings: Any,
) -> None:
    """A continuous run read the stream split for a day and ended: the split waits from
    the moment the run gave it back, not from its registration. A file returned by the same
    run has waited since it was registered (it was never read)."""
    from datetime import UTC, datetime, timedelta

    from enumerator_service import SplitStore
    from enumerator_service._live_state import live_state

    settings: TestSettings = make_settings()
    platform = open_platform(settings)
    source = f"cdcwait_{secrets.token_hex(3)}"
    insert = sa.text(
        "INSERT INTO sluice.splits (source, kind, uri, start_offset, end_offset, status,"
        " run_id, registered_at) VALUES (:s, :k, :u, 0, :e, 'READING', 'run-1',"
        " now() - interval '1 day')"
    )
    try:
        with platform.engine.begin() as conn:
            conn.execute(insert, {"s": source, "k": "pgcdc", "u": "slot", "e": None})
        assert SplitStore(platform.engine).release_run("run-1") == 1
        with platform.engine.connect() as conn:
            now = conn.execute(sa.select(sa.func.now())).scalar_one()
            age = live_state(conn, source, now + timedelta(seconds=10))
            assert age.oldest_unprocessed_age_seconds is not None
            assert 9 <= age.oldest_unprocessed_age_seconds <= 60, age
        with platform.engine.begin() as conn:
            conn.execute(sa.text("DELETE FROM sluice.splits WHERE source = :s"), {"s": source})
            conn.execute(insert, {"s": source, "k": "file", "u": "f.jsonl", "e": 10})
        assert SplitStore(platform.engine).release_run("run-1") == 1
        with platform.engine.connect() as conn:
            age = live_state(conn, source, datetime.now(UTC))
            assert age.oldest_unprocessed_age_seconds is not None
            assert age.oldest_unprocessed_age_seconds >= 86_000, age
    finally:
        with platform.engine.begin() as conn:
            conn.execute(sa.text("DELETE FROM sluice.splits WHERE source = :s"), {"s": source})
        platform.close()


class _Level:
    def __init__(self, level: str) -> None:
        self.level = level

    def execute(self, _query: object) -> _Level:
        return self

    def scalar_one(self) -> str:
        return self.level


def test_a_server_without_logical_wal_level_is_one_line() -> None:
    with pytest.raises(ConfigError, match=r"^wal_level: is 'replica' on the source server") as err:
        check_wal_level(_Level("replica"))  # type: ignore[arg-type]
    assert "\n" not in str(err.value)
    check_wal_level(_Level("logical"))  # type: ignore[arg-type]


def test_a_table_without_a_key_is_one_line_before_any_work(make_settings: Any) -> None:
    settings: TestSettings = make_settings()
    platform = open_platform(settings)
    table = f"public.cdc_{secrets.token_hex(3)}"
    try:
        with platform.engine.begin() as conn:
            conn.execute(sa.text(f"CREATE TABLE {table} (id bigint, v text, n bigint)"))
        pipeline = _pipeline(f"cdcnokey_{secrets.token_hex(3)}", table)
        with pytest.raises(
            PipelineDefinitionError, match="no primary key and no replica identity"
        ) as err:
            run_pipeline(settings, pipeline)
        assert "REPLICA IDENTITY FULL" in str(err.value) and "\n" not in str(err.value)
    finally:
        platform.close()


def test_another_pipelines_slot_is_neither_read_nor_dropped(
    make_settings: Any, db_url: str, tmp_path: Path
) -> None:
    """A slot belongs to the pipeline that created it (its discovery cursor records it): a
    pipeline naming it is refused in one line naming PostgresCdcSource(slot) and the owner —
    at discovery and at a run's start — and its 'cdc drop' leaves the slot. A slot no
    cursor records but another pipeline's stream split reads (an older version's) is not
    adopted either."""
    settings: TestSettings = make_settings()
    platform = open_platform(settings)
    owner = _pipeline(f"cdcown_{secrets.token_hex(3)}", f"public.cdc_{secrets.token_hex(3)}")
    slot = owner.plan.source.options.slot
    theirs = f"public.cdc_{secrets.token_hex(3)}"
    intruder = Pipeline(
        name=f"cdcint_{secrets.token_hex(3)}",
        source=PostgresCdcSource(
            tables=theirs, key="id", schema={"id": "int64", "v": "string", "n": "int64"}, slot=slot
        ),
        sink=PostgresSink(f"{theirs}_out", upsert_key=["id"]),
    )
    publication = intruder.plan.source.options.publication

    def refused(error: BaseException) -> None:
        line = str(error)
        assert "\n" not in line and "PostgresCdcSource(slot)" in line, line
        assert f"belongs to pipeline '{owner.name}'" in line, line

    try:
        create_table(platform.engine, owner.plan.source.options.table_names[0], rows=10)
        create_table(platform.engine, theirs, rows=10)
        assert discover(platform, discovery_of(owner, settings)).splits_registered == 1
        with platform.engine.connect() as conn:
            before = slot_info(conn, slot)
        assert before is not None
        # (a) discovery: refused, nothing created (no publication), the slot untouched.
        with pytest.raises(ConfigError) as err:
            discover(platform, discovery_of(intruder, settings))
        refused(err.value)
        assert _published(platform, publication) is None
        # (b) a run's start: refused before any split is assigned.
        with pytest.raises(ConfigError) as err:
            run_pipeline(settings, intruder)
        refused(err.value)
        # (c) its drop: refused, the owner's slot and splits stay.
        with pytest.raises(ConfigError) as err:
            release_source(platform.engine, intruder.name, slot, publication, [])
        assert "nothing dropped" in str(err.value)
        refused(err.value)
        with platform.engine.connect() as conn:
            after = slot_info(conn, slot)
            assert after is not None and after.confirmed_flush == before.confirmed_flush
            owned = sa.text("SELECT count(*) FROM sluice.splits WHERE source = :s")
            assert conn.execute(owned, {"s": owner.name}).scalar_one() == 1
        # (c') the same from the command line: one line, exit 2, the slot left.
        module = MODULE.format(name=intruder.name, table=theirs).replace(
            'key="id",', f'key="id", slot="{slot}",'
        )
        (tmp_path / "cdc_pipelines.py").write_text(module)
        env = {"SLUICE_PIPELINES": "cdc_pipelines", "SLUICE_DATABASE_URL": db_url}
        for args in (["run", intruder.name], ["cdc", "drop", intruder.name, "--yes"]):
            shown = _sluice(args, env, tmp_path)
            assert shown.returncode == 2, shown.stdout + shown.stderr
            lines = shown.stderr.strip().splitlines()
            assert len(lines) == 1 and "Traceback" not in shown.stderr, shown.stderr
            assert "splits" not in shown.stdout, shown.stdout  # no empty progress bar above
            refused(Exception(lines[0]))
        with platform.engine.connect() as conn:
            assert slot_info(conn, slot) is not None
        # (d) an older version's records: no slot in the cursor, a stream split on the slot.
        with platform.engine.begin() as conn:
            conn.execute(
                sa.text(
                    "UPDATE sluice.enumerator_state SET cursor = cursor - 'slot' WHERE source = :s"
                ),
                {"s": owner.name},
            )
            conn.execute(
                sa.text(
                    "INSERT INTO sluice.splits (source, kind, uri, start_offset)"
                    " VALUES (:s, 'pgcdc', :slot, 0)"
                ),
                {"s": owner.name, "slot": slot},
            )
        with pytest.raises(ConfigError) as err:
            discover(platform, discovery_of(intruder, settings))
        refused(err.value)
        # The owner itself goes on, and records the slot as its own again.
        discover(platform, discovery_of(owner, settings))
        with platform.engine.connect() as conn:
            cursor = conn.execute(
                sa.text("SELECT cursor FROM sluice.enumerator_state WHERE source = :s"),
                {"s": owner.name},
            ).scalar_one()
        assert cursor["slot"] == slot
    finally:
        drop_slot(platform.engine, slot, owner.plan.source.options.publication)
        drop_slot(platform.engine, intruder.plan.source.options.slot, publication)
        platform.close()
