"""Every Postgres column type the CDC source carries: a snapshot row and a streamed row of
the same values are the same in the sink, column by column (json, jsonb, arrays, uuid,
numeric, timestamptz, interval, bytea, an enum, domains). The oracle is Postgres's own text
form of the source's values (``format('%s', col)``, the output function the walsender calls).
"""

from __future__ import annotations

import secrets
from typing import Any

import pytest
import sqlalchemy as sa
from cdc_oracle import libpq_url
from conftest import TestSettings

from enumerator_service import TableRangeSplit
from enumerator_service._operations import discover, open_platform
from spark_jobs import Pipeline, PostgresCdcSource, PostgresSink
from spark_jobs.connectors.postgres_cdc import drop_slot
from spark_jobs.connectors.postgres_cdc._changes import CdcError
from spark_jobs.connectors.postgres_cdc._snapshot import ChunkReader
from spark_jobs.jobs import run_pipeline
from spark_jobs.jobs._source_reader import record_schema
from spark_jobs.pipeline._paths import discovery_of
from spark_jobs.source._records import SplitRead

pytestmark = pytest.mark.spark

#: column → (SQL type, declared type, value A, value B); A and B are SQL literals.
COLUMNS: dict[str, tuple[str, str, str, str]] = {
    "j": ("json", "string", """'"just a string"'""", """'{"b": [1, 2.50], "a": null}'"""),
    "jb": ("jsonb", "string", "'null'", """'{"b": [1, 2.50], "a": {"c": "x"}}'"""),
    "ints": ("int[]", "string", "'{1,2,NULL}'", "'{}'"),
    "texts": ("text[]", "string", """'{"a b",c}'""", """'{"{x}","\\"q\\""}'"""),
    "u": ("uuid", "string", "'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11'", "gen_random_uuid()"),
    "num": ("numeric(12,3)", "decimal(12,3)", "'-123456789.125'", "'0.001'"),
    "anynum": ("numeric", "string", "'1e-20'", "'NaN'"),
    "ts": ("timestamptz", "timestamp", "'2026-03-01 12:34:56.789012+05:30'", "'1970-01-01Z'"),
    "iv": ("interval", "string", "'1 year 2 mons 3 days 04:05:06.5'", "'-1 day'"),
    "b": ("bytea", "binary", """'\\x00ff10'""", "''"),
    "e": ("{enum}", "string", "'sad'", "'happy'"),
    "dt": ("{dtext}", "string", "'x'", "''"),
    "di": ("{dint}", "string", "42", "-1"),
    "ch": ("char(4)", "string", "'ab'", "'abcd'"),
    "f": ("float8", "double", "0.1", "'1e300'"),
    "d": ("date", "date", "'2026-02-28'", "'0001-01-01'"),
}


def _create(engine: sa.Engine, table: str, suffix: str) -> None:
    names = {"enum": f"mood_{suffix}", "dtext": f"dtext_{suffix}", "dint": f"dint_{suffix}"}
    columns = ", ".join(f"{c} {t.format(**names)}" for c, (t, _, _, _) in COLUMNS.items())
    values = {v: ", ".join(spec[i] for spec in COLUMNS.values()) for v, i in (("A", 2), ("B", 3))}
    with engine.begin() as conn:
        conn.execute(sa.text(f"CREATE TYPE {names['enum']} AS ENUM ('sad', 'happy')"))
        conn.execute(sa.text(f"CREATE DOMAIN {names['dtext']} AS text"))
        conn.execute(sa.text(f"CREATE DOMAIN {names['dint']} AS int CHECK (VALUE < 100)"))
        conn.execute(sa.text(f"CREATE TABLE {table} (id bigint PRIMARY KEY, {columns})"))
        # Rows 1 and 3: values A and B, read by the snapshot; 2 and 4 get them streamed.
        conn.execute(sa.text(f"INSERT INTO {table} VALUES (1, {values['A']})"))
        conn.execute(sa.text(f"INSERT INTO {table} (id) VALUES (2), (4)"))
        conn.execute(sa.text(f"INSERT INTO {table} VALUES (3, {values['B']})"))


def _texts(engine: sa.Engine, table: str) -> dict[int, tuple[Any, ...]]:
    texts = ", ".join(f"format('%s', {c}), {c} IS NULL" for c in COLUMNS)
    with engine.connect() as conn:
        rows = conn.execute(sa.text(f"SELECT id, {texts} FROM {table} ORDER BY id")).all()
    return {int(r[0]): tuple(r[1:]) for r in rows}


def test_snapshot_and_stream_values_are_the_same_for_every_type(make_settings: Any) -> None:
    settings: TestSettings = make_settings(parallelism=1, checkpoint_interval_seconds=0.5)
    platform = open_platform(settings)
    suffix = secrets.token_hex(3)
    table = f"public.cdct_{suffix}"
    pipeline = Pipeline(
        name=f"cdctypes_{suffix}",
        source=PostgresCdcSource(
            tables=[table],
            key="id",
            schema={"id": "int64", **{c: spec[1] for c, spec in COLUMNS.items()}},
        ),
        sink=PostgresSink(f"{table}_out", upsert_key=["id"]),
    )
    options = pipeline.plan.source.options
    try:
        _create(platform.engine, table, suffix)
        discover(platform, discovery_of(pipeline, settings))
        snapshot = run_pipeline(settings, pipeline)
        assert (snapshot.rows_out, snapshot.dead_letters) == (4, 0)
        names = ", ".join(COLUMNS)
        with platform.engine.begin() as conn:
            for target, source in ((2, 1), (4, 3)):
                conn.execute(
                    sa.text(
                        f"UPDATE {table} SET ({names}) = (SELECT {names} FROM {table}"
                        f" WHERE id = {source}) WHERE id = {target}"
                    )
                )
        assert discover(platform, discovery_of(pipeline, settings)).splits_registered == 1
        stream = run_pipeline(settings, pipeline)
        assert (stream.rows_out, stream.dead_letters) == (2, 0)
        sink = _texts(platform.engine, f"{table}_out")
        assert sorted(sink) == [1, 2, 3, 4]
        source = _texts(platform.engine, table)
        declared_text = [i for i, spec in enumerate(COLUMNS.values()) if spec[1] == "string"]
        for snapshotted, streamed in ((1, 2), (3, 4)):
            for i, column in enumerate(COLUMNS):
                # The snapshot's value is the stream's, column by column (text and nullness).
                pair = sink[snapshotted][2 * i : 2 * i + 2], sink[streamed][2 * i : 2 * i + 2]
                assert pair[0] == pair[1], (column, pair)
            for i in declared_text:
                # A column declared string holds the source's exact text.
                assert (
                    sink[snapshotted][2 * i : 2 * i + 2] == source[snapshotted][2 * i : 2 * i + 2]
                )
    finally:
        drop_slot(platform.engine, options.slot, options.publication)
        platform.close()


def test_a_snapshot_value_the_stream_refuses_fails_with_the_streams_line(
    make_settings: Any,
) -> None:
    """A timestamp Python cannot hold: the stream fails the run naming table and column; the
    snapshot of the same row fails the same way (psycopg's own error was another line)."""
    settings: TestSettings = make_settings()
    platform = open_platform(settings)
    suffix = secrets.token_hex(3)
    table, name = f"public.cdcinf_{suffix}", f"cdcinf_{suffix}"
    pipeline = Pipeline(
        name=name,
        source=PostgresCdcSource(
            tables=[table], key="id", schema={"id": "int64", "at": "timestamp"}
        ),
        sink=PostgresSink(f"{table}_out", upsert_key=["id"]),
    )
    source = pipeline.plan.source
    try:
        with platform.engine.begin() as conn:
            conn.execute(sa.text(f"CREATE TABLE {table} (id bigint PRIMARY KEY, at timestamptz)"))
            conn.execute(sa.text(f"INSERT INTO {table} VALUES (1, now()), (2, 'infinity')"))
            conn.execute(
                sa.text("INSERT INTO sluice.enumerator_state (source, cursor) VALUES (:s, :c)"),
                {"s": name, "c": '{"start_lsn": 1}'},
            )
        reader = ChunkReader(
            record_schema(source), libpq_url(platform.url), declared=source.options.declared
        )
        split = TableRangeSplit(name, table, "id", 1, 3, kind="pgcdc-chunk")
        reader.open(SplitRead(1, split, 1))
        refused = f"table {table}: column 'at': timestamp value 'infinity' cannot be represented"
        with pytest.raises(CdcError, match=refused) as err:
            reader.fetch()
        assert str(err.value).endswith(
            "the snapshot reads it again from the table: change the value there, then run again"
        )
        reader.close()
    finally:
        platform.close()
