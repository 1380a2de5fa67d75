"""The clickstream example (``make demo``'s pipeline) end to end, as the example defines it,
with its own sample data — against an independent oracle: the landing files parsed with the
standard library's ``json`` and LEFT JOINed with the users table in SQL."""

from __future__ import annotations

import dataclasses
from typing import Any

import pyarrow.dataset as ds
import pytest
import sqlalchemy as sa
from conftest import TestSettings
from landing_oracle import expected_events

from enumerator_service import asyncpg_dsn
from enumerator_service._operations import discover, open_platform
from examples.clickstream import clickstream
from spark_jobs import SampleTarget
from spark_jobs.connectors.files import landing_path
from spark_jobs.connectors.parquet import output_path
from spark_jobs.jobs import run_pipeline
from spark_jobs.pipeline._paths import discovery_of

pytestmark = pytest.mark.spark

COLUMNS = [
    "event_id",
    "user_id",
    "event_time",
    "event_type",
    "amount",
    "user_name",
    "user_country",
    "user_tier",
    "user_signup_time",
    "dt",
]


def test_clickstream_equals_a_sql_join_of_the_landing_files(make_settings: Any) -> None:
    settings: TestSettings = make_settings()
    # The example under the test's own name (its split source); folders as it defines them.
    pipeline = dataclasses.replace(clickstream, name=settings.source_name)
    platform = open_platform(settings)
    try:
        landing = landing_path(pipeline, settings)
        assert landing == settings.data_path / "landing" / "events"
        said = pipeline.sample_data(SampleTarget(settings, landing, asyncpg_dsn(platform.url)))  # type: ignore[misc]
        assert "events" in said
        discover(platform, discovery_of(pipeline, settings))
        summary = run_pipeline(settings, pipeline)
        expected, malformed = expected_events(landing)
        assert (summary.rows_out, summary.dead_letters, summary.dropped) == (
            len(expected),
            malformed,
            0,
        )
        with platform.engine.begin() as conn:
            conn.execute(
                sa.text(
                    "CREATE TEMP TABLE expected (event_id text, user_id bigint, event_time"
                    " timestamptz, event_type text, amount double precision, dt text)"
                )
            )
            conn.execute(
                sa.text(
                    "INSERT INTO expected VALUES (:event_id, :user_id, :event_time, :event_type,"
                    " :amount, :dt)"
                ),
                expected,
            )
            joined = conn.execute(
                sa.text(
                    "SELECT e.event_id, e.user_id, e.event_time, e.event_type, e.amount, u.name,"
                    " u.country, u.tier, u.signup_time, e.dt FROM expected e"
                    " LEFT JOIN public.users u ON u.id = e.user_id ORDER BY e.event_id"
                )
            ).all()
        table = ds.dataset(output_path(pipeline, settings), format="parquet", partitioning="hive")
        rows = sorted(table.to_table().to_pylist(), key=lambda r: r["event_id"])
        assert [tuple(str(r[c]) if c == "dt" else r[c] for c in COLUMNS) for r in rows] == [
            tuple(j) for j in joined
        ]
        assert any(r["user_name"] is None for r in rows), "unknown users stay (left join)"
        assert run_pipeline(settings, pipeline).nothing_new
    finally:
        platform.close()
