"""SQL reserved words (``user``, ``order``, ``group``, ``select``, …) as schema, table and
column names, end to end on real Postgres and local Spark: a TableSource over a table named
``user`` keyed by ``order``, lookups into ``"user"."order"`` (one key part, a composite key,
the full cache), sunk into a table named ``order`` upserted on ``user`` — the output equals
a SQL oracle's. And hostile names are refused with one line naming the field."""

from __future__ import annotations

import secrets
from typing import Any

import pytest
import sqlalchemy as sa
from conftest import TestSettings

from dagster_project._check_outcomes import _duplicates
from dagster_project._counts import _rows_out
from enumerator_service import (
    ConfigError,
    TableRangeEnumerator,
    asyncpg_dsn,
    connect_engine,
    quote_identifier,
    validate_identifier,
)
from enumerator_service._operations import discover, open_platform
from examples._clickstream_data import load_users
from spark_jobs import (
    FullCache,
    Lookup,
    Pipeline,
    PipelineDefinitionError,
    PostgresSink,
    TableSource,
)
from spark_jobs.jobs import run_pipeline
from spark_jobs.pipeline._paths import discovery_of

ROWS = 120

#: The lookup table "user"."order" and the source table public."user".
_SETUP = [
    'CREATE SCHEMA "user"',
    'CREATE TABLE "user"."order" ("user" bigint PRIMARY KEY, "order" text, "group" text)',
    "INSERT INTO \"user\".\"order\" SELECT g, 'o' || g, 'g' || (g % 3)"
    " FROM generate_series(1, 7) g",
    'CREATE TABLE public."user" ("order" bigint PRIMARY KEY, "user" bigint UNIQUE,'
    ' "group" bigint, "select" text)',
    # group 8 and 9 have no row in "user"."order": kept with nulls.
    f"INSERT INTO public.\"user\" SELECT g, 1000 + g, 1 + g % 9, 's' || g"
    f" FROM generate_series(1, {ROWS}) g",
]
#: What the pipeline must write, computed by Postgres itself.
_ORACLE = """
SELECT u."user", u."order", u."group", u."select", l."order" AS "where", l."group" AS "from",
       c."group" AS "table", f."order" AS "limit"
FROM public."user" u
LEFT JOIN "user"."order" l ON l."user" = u."group"
LEFT JOIN "user"."order" c ON c."user" = u."group" AND c."order" = l."order"
LEFT JOIN "user"."order" f ON f."user" = u."group"
ORDER BY u."user"
"""
_OUTPUT = (
    'SELECT "user", "order", "group", "select", "where", "from", "table", "limit"'
    ' FROM public."order" ORDER BY "user"'
)


def _pipeline(name: str) -> Pipeline:
    return Pipeline(
        name=name,
        source=TableSource(
            "public.user",
            key="order",
            schema={"order": "int64", "user": "int64", "group": "int64", "select": "string"},
            required=["order", "user"],
            rows_per_split=50,
        ),
        steps=[
            # One key part: the ``= ANY($1)`` query.
            Lookup("user.order", on={"group": "user"}, columns={"order": "where", "group": "from"}),
            # A composite key: the ``unnest(…) JOIN`` query.
            Lookup(
                "user.order", on={"group": "user", "where": "order"}, columns={"group": "table"}
            ),
            # The full cache: the load of the whole table.
            Lookup(
                "user.order", on={"group": "user"}, columns={"order": "limit"}, cache=FullCache()
            ),
        ],
        sink=PostgresSink("public.order", upsert_key=["user"]),
        key=["user"],
    )


@pytest.mark.spark
def test_reserved_words_work_as_schema_table_and_column_names(make_settings: Any) -> None:
    settings: TestSettings = make_settings()
    platform = open_platform(settings)
    try:
        with platform.engine.begin() as conn:
            for statement in _SETUP:
                conn.execute(sa.text(statement))
        pipeline = _pipeline(f"rsv_{secrets.token_hex(3)}")
        found = discover(platform, discovery_of(pipeline, settings))
        assert found.splits_registered == 3  # 120 keys, ~50 per range
        summary = run_pipeline(settings, pipeline)
        assert (summary.rows_out, summary.dead_letters) == (ROWS, 0)
        # Run again after an update: the upsert on "user" replaces, never duplicates.
        with platform.engine.begin() as conn:
            conn.execute(sa.text('UPDATE "user"."order" SET "order" = \'new\' WHERE "user" = 2'))
            conn.execute(
                sa.text(
                    f"INSERT INTO public.\"user\" SELECT g, 1000 + g, 2, 's' || g"
                    f" FROM generate_series({ROWS + 1}, {ROWS + 5}) g"
                )
            )
        discover(platform, discovery_of(pipeline, settings))
        again = run_pipeline(settings, pipeline)
        assert again.rows_out == 5
        with platform.engine.connect() as conn:
            expected = [tuple(r) for r in conn.execute(sa.text(_ORACLE)).all()]
            written = [tuple(r) for r in conn.execute(sa.text(_OUTPUT)).all()]
        # Rows read before the update keep the old "order" of group 2; the new rows see 'new'.
        old = {r[0]: r for r in written if r[2] == 2 and r[0] <= 1000 + ROWS}
        assert old and all(r[4:] == ("o2", "g2", "g2", "o2") for r in old.values())
        fresh = [r for r in written if r[0] > 1000 + ROWS]
        assert [r[4:] for r in fresh] == [("new", "g2", "g2", "new")] * 5
        assert [r for r in written if r[0] not in old] == [r for r in expected if r[0] not in old]
        assert len(written) == ROWS + 5
        misses = [r for r in written if r[2] in (8, 9)]
        assert misses and all(r[4:] == (None, None, None, None) for r in misses)
        # The Dagster side: output counts and the duplicate-key check query the table too.
        with platform.engine.connect() as conn:
            assert _rows_out(conn, pipeline, settings, [None]) == {None: ROWS + 5}
        assert _duplicates(pipeline, settings, None) == (0, [])
    finally:
        platform.close()


@pytest.mark.parametrize(
    "hostile",
    ['x"; drop table y; --', "order;", "a b", "", "x\x00y", "Ünïcode", "a" * 64, "user.name"],
)
def test_hostile_identifiers_are_refused_with_one_line_naming_the_field(hostile: str) -> None:
    with pytest.raises(ConfigError) as config:
        validate_identifier(hostile, "SLUICE_LOOKUP_TABLE")
    assert str(config.value).startswith("SLUICE_LOOKUP_TABLE: ")
    assert "\n" not in str(config.value)
    with pytest.raises(ConfigError) as enumerator:
        TableRangeEnumerator(
            sa.create_engine("postgresql+psycopg://"),
            "s",
            schema="public",
            table="t",
            key_column=hostile,
        )
    assert str(enumerator.value).startswith("key_column: ")
    cases: list[tuple[dict[str, Any], str]] = [
        (
            {"source": TableSource(f"public.{hostile}", key="id", schema={"id": "int64"})},
            "source: table",
        ),
        ({"source": TableSource("public.t", key=hostile, schema={"id": "int64"})}, "source: key"),
        ({"steps": [Lookup(f"ref.{hostile}", on="id", columns=["v"])]}, "step 1"),
        ({"steps": [Lookup("ref.t", on={"id": hostile}, columns=["v"])]}, "step 1"),
        ({"steps": [Lookup("ref.t", on="id", columns=[hostile])]}, "step 1"),
        ({"sink": PostgresSink(f"{hostile}.t")}, "sink"),
        ({"sink": PostgresSink("public.t", upsert_key=[hostile])}, "sink"),
    ]
    for change, where in cases:
        parts: dict[str, Any] = {
            "name": "hostile",
            "source": TableSource("public.t", key="id", schema={"id": "int64"}),
            "steps": [],
            "sink": PostgresSink("public.t"),
        }
        parts.update(change)
        with pytest.raises(PipelineDefinitionError) as error:
            Pipeline(**parts).plan  # noqa: B018 - validation happens when the plan is derived
        message = str(error.value)
        assert "\n" not in message and "\x00" not in message, message
        assert message.startswith(f"pipeline hostile: {where}"), message


def test_the_demo_loader_creates_and_fills_a_table_named_by_reserved_words(db_url: str) -> None:
    schema = f"user_{secrets.token_hex(3)}"
    engine = connect_engine(db_url, pool_size=1)
    try:
        with engine.begin() as conn:
            conn.execute(sa.text(f'CREATE SCHEMA "{schema}"'))
        dsn = asyncpg_dsn(db_url)
        assert load_users(dsn, schema=schema, table="order", key="group", users=25, seed=1)
        assert not load_users(dsn, schema=schema, table="order", key="group", users=25, seed=1)
        with engine.connect() as conn:
            keys = conn.execute(sa.text(f'SELECT "group" FROM "{schema}"."order" ORDER BY 1'))
            assert keys.scalars().all() == list(range(1, 26))
    finally:
        with engine.begin() as conn:
            conn.execute(sa.text(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE'))
        engine.dispose()


@pytest.mark.parametrize("name", ['x"; drop table y; --', "a.b", "", "x\x00y", "a" * 64, "1a"])
def test_quoting_refuses_what_it_would_have_to_escape(name: str) -> None:
    with pytest.raises(ValueError, match="is not a valid SQL name"):
        quote_identifier(name)
    assert quote_identifier("order") == '"order"'
    assert quote_identifier("Total") == '"Total"'  # a record field: case kept
