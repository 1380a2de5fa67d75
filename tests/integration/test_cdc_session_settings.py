"""A source database whose own settings change how values print — ``DateStyle`` SQL/DMY,
``extra_float_digits`` 0 (15 significant digits), ``bytea_output`` escape — must not change
what the CDC readers read: their connections set the text forms they parse
(``_source_db.SESSION_OPTIONS``). Both readers, without Spark: the snapshot's chunk reader
gives the exact values, and the stream's replication connection sends ISO dates, floats
that round-trip and hex ``bytea`` (the text ``_pgoutput`` parses)."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from datetime import date
from typing import Any

import psycopg
import pytest
from cdc_oracle import libpq_url
from sqlalchemy.engine import make_url

from enumerator_service import TableRangeSplit
from enumerator_service._operations import open_platform
from spark_jobs import Pipeline, PostgresCdcSource, PostgresSink
from spark_jobs.connectors.postgres_cdc._pgoutput import Change, Relation, decode, from_text
from spark_jobs.connectors.postgres_cdc._replication import open_replication
from spark_jobs.connectors.postgres_cdc._snapshot import ChunkReader
from spark_jobs.jobs._source_reader import record_schema
from spark_jobs.source._records import SplitRead

FLOAT = 0.12345678901234568  # 17 significant digits: 15 give another float
VALUES = (date(2026, 2, 28), FLOAT, b"\x00\xff\\x")


@pytest.fixture
def odd_database(make_settings: Any) -> Iterator[tuple[str, str]]:
    """(libpq URL of a fresh database whose defaults print values unusually, its name)."""
    settings = make_settings()
    platform = open_platform(settings)
    name = f"cdcodd_{secrets.token_hex(3)}"
    with psycopg.connect(libpq_url(platform.url), autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
        for setting, value in (
            ("datestyle", "SQL, DMY"),
            ("extra_float_digits", "0"),
            ("bytea_output", "escape"),
        ):
            conn.execute(f"ALTER DATABASE \"{name}\" SET {setting} = '{value}'")
    url = libpq_url(make_url(platform.url).set(database=name).render_as_string(False))
    try:
        with psycopg.connect(url) as conn:  # the defaults hold for a plain connection
            shown = conn.execute("SELECT '2026-02-28'::date::text, %s::float8::text", (FLOAT,))
            assert shown.fetchone() == ("28/02/2026", "0.123456789012346")
        yield url, name
    finally:
        with psycopg.connect(libpq_url(platform.url), autocommit=True) as conn:
            conn.execute(
                "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots"
                " WHERE database = %s",
                (name,),
            )
            conn.execute(f'DROP DATABASE "{name}" WITH (FORCE)')
        platform.close()


def _create(url: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE TABLE public.t (id bigint PRIMARY KEY, d date, f float8, b bytea)")
        conn.execute("INSERT INTO public.t VALUES (1, %s, %s, %s)", VALUES)


def test_the_snapshot_reads_exact_values_whatever_the_database_prints(
    odd_database: tuple[str, str],
) -> None:
    url, name = odd_database
    _create(url)
    pipeline = Pipeline(
        name=name,
        source=PostgresCdcSource(
            tables=["public.t"],
            key="id",
            schema={"id": "int64", "d": "date", "f": "double", "b": "binary"},
        ),
        sink=PostgresSink("public.t_out", upsert_key=["id"]),
    )
    source = pipeline.plan.source
    with psycopg.connect(url, autocommit=True) as conn:  # the discovery cursor the reader reads
        conn.execute("CREATE SCHEMA sluice")
        conn.execute("CREATE TABLE sluice.enumerator_state (source text, cursor jsonb)")
        conn.execute(
            "INSERT INTO sluice.enumerator_state VALUES (%s, '{\"start_lsn\": 1}')", (name,)
        )
    reader = ChunkReader(record_schema(source), url, declared=source.options.declared)
    reader.open(SplitRead(1, TableRangeSplit(name, "public.t", "id", 1, 2, kind="pgcdc-chunk"), 1))
    try:
        block, _ = reader.fetch()
        assert block is not None
        rows = block.rows.to_pylist()
    finally:
        reader.close()
    assert [(r["d"], r["f"], r["b"]) for r in rows] == [VALUES]


def test_the_stream_receives_the_text_it_parses_whatever_the_database_prints(
    odd_database: tuple[str, str],
) -> None:
    url = odd_database[0]
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE TABLE public.t (id bigint PRIMARY KEY, d date, f float8, b bytea)")
        conn.execute("CREATE PUBLICATION p FOR TABLE public.t")
        conn.execute("SELECT pg_create_logical_replication_slot('s', 'pgoutput')")
        conn.execute("INSERT INTO public.t VALUES (1, %s, %s, %s)", VALUES)
    connection, cursor = open_replication(url, "s", 0, "p")
    relation: Relation | None = None
    try:
        while True:
            message = cursor.read_message()
            if message is None:
                continue
            decoded = decode(message.payload)
            if isinstance(decoded, Relation):
                relation = decoded
            if isinstance(decoded, Change):
                break
    finally:
        connection.close()
    assert relation is not None and decoded.new is not None
    texts = decoded.new[1:]
    assert texts[:2] == ("2026-02-28", "0.12345678901234568")
    values = tuple(
        from_text(column.type_oid, text)
        for column, text in zip(relation.columns[1:], texts, strict=True)
    )
    assert values == VALUES
